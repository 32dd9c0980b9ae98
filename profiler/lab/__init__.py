"""The two-node lab (runtime, root): settings, network namespaces and tc shaping (net.py), the probe,
and the TP sweep's measured-vs-predicted model (sweep_model.py).
"""
