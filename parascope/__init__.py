"""ParaScope: plan, profile and review 3D-parallel training jobs. `parascope <command>` (parascope/cli.py)
runs the dashboard and every command of `python -m parallel` and `python -m profiler`."""
