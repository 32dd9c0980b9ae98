"""The `python -m profiler <command>` commands: one module each, with `main(argv) -> int`, imported only
when asked for (parallel.cli.dispatch). `parascope` (parascope/cli.py) serves the same table."""

COMMANDS = {
    "run": ("profiler.cli.run", "profile a parallel job on every rank into a run directory"),
    "commbench": ("profiler.cli.commbench", "time collectives and fit latency/bandwidth per link"),
    "analyze": ("profiler.cli.analyze", "load and analyse per-rank Kineto traces"),
    "calibrate": ("profiler.cli.calibrate", "fit the step-time model to measured runs (calib.json)"),
    "hang": ("profiler.cli.hang", "why a job hung: Flight Recorder dumps across ranks"),
    "replan": ("profiler.cli.replan", "re-plan a job from its traces: faster plans, by how much, and why"),
    "whatif": ("profiler.cli.whatif", "replay a measured trace with changes: a rank's speed, a link, overlap"),
    "lab": ("profiler.cli.lab", "two-node lab: network namespaces joined by a shaped link"),
    "tpsweep": ("profiler.cli.tpsweep", "measure TP scaling across the lab's node boundary"),
}
