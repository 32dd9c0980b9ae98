"""Trace loading (pure: numpy, pandas, pyarrow, msgspec): sources and archives, Kineto decoding,
the loader and its Arrow cache, event patterns, typed errors, interval arithmetic.
"""
