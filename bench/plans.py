"""The predicted = measured benchmarks' model (bench.predict, bench.predict_lab, bench.predict_offline)
and how a plan's flags read: `parallel train`'s own parsing, so a bench plan means what it launches."""

from __future__ import annotations

from parallel.cli import args as cli_args
from parallel.cli.train import parser, plan_of_args

MODEL = ["--model", "tiny"]


def plan_model(flags: list[str]):
    """(Model, Plan) of `parallel train` MODEL + flags."""
    a = parser().parse_args([*MODEL, *flags])
    return cli_args.model_from_args(a), plan_of_args(a)
