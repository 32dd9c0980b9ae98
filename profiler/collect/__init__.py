"""Profile collection (runtime): `profiler run`'s supervisor, rank worker, launchers (local agent,
torchrun), the run spec (its flags), the dashboard's demo run and background jobs, uploaded trace
sets checked and stored (uploads), every set collected, run or upload, by id (trace_sets), and the
step-time calibration fitted from them (runs_calibration).
"""
