"""Profile collection (runtime): `profiler run`'s supervisor, rank worker, launchers (local agent,
torchrun), the run spec (its flags) and the dashboard's demo run.
"""
