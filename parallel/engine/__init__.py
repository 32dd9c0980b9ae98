"""The runnable engine (runtime: torch): a small GPT trained under any DP x TP x PP x CP (+SP) plan
with torch.distributed, one parallelism per file. api.py is what wrappers import without torch.
"""
