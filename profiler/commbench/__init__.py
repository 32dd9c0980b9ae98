"""The collective benchmark (runtime): the rank worker (torch), its spec (flags, no torch) and the
alpha-beta fit in the plan model's terms (fit.py, pure).
"""
