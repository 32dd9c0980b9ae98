"""Profile collection (runtime): `profiler run`'s supervisor, rank worker, launchers (local agent,
torchrun), the run spec (its flags), the dashboard's demo run and background jobs, and the trace sets
collected (trace_sets: runs and uploads on disk, by id).
"""
