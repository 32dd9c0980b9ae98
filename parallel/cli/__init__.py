"""The `python -m parallel <command>` commands: one module each, with `main(argv) -> int`, imported only
when asked for (parallel.cli.dispatch). `parascope` (parascope/cli.py) serves the same table."""

COMMANDS = {
    "plan": ("parallel.cli.plan", "validate a plan and print its memory, communication and step time"),
    "train": ("parallel.cli.train", "train the small GPT under a plan (torchrun or the local launcher)"),
    "search": ("parallel.cli.search", "enumerate valid plans for a model and cluster, best first"),
}
