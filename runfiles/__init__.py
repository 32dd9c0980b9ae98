"""Contracts shared by writers and readers (pure, stdlib): the run directory (rundir.py, runs.py),
metrics.json (metrics.py) and the ps.comm / ps.phase annotation names (annotations.py). The engine,
the supervisor and the dashboard all import these; none imports another's package for them.
"""
