"""Every case of PyTorch's own Flight Recorder analyzer tests (tests/support/fr_reference_cases.py),
as per-rank JSON dumps: our diagnosis gives the verdict the PyTorch test expects, and PyTorch's
build_db reads the same dumps (and dumps our engine writes) to the same verdict."""

import json
import logging

import pytest
from torch.distributed.flight_recorder.components.builder import build_db  # torch: only for the reference
from torch.distributed.flight_recorder.components.config_manager import JobConfig
from torch.distributed.flight_recorder.components.types import COLLECTIVES

from profiler.analyzers.hang import diagnose, load_dumps
from tests.support.fr_reference_cases import CASES, COLLECTIVE_NAMES, write_case


def _pytorch_passes(folder) -> bool:
    """True when torch.distributed.flight_recorder's build_db finds every collective matched."""
    details = {}
    for path in sorted(folder.glob("rank*.json")):
        dump = json.loads(path.read_text())
        details[path.stem] = {**dump, "rank": int(path.stem.removeprefix("rank"))}
    logger = logging.getLogger("Flight Recorder")
    level, logger.level = logger.level, logging.CRITICAL
    try:
        db = build_db(details, JobConfig().parse_args([]), next(iter(details.values()))["version"])
    finally:
        logger.setLevel(level)
    return all(c.pass_check for c in db.collectives)


def test_the_collectives_are_pytorchs():
    assert set(COLLECTIVE_NAMES) == set(COLLECTIVES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_our_verdict_is_the_pytorch_tests(tmp_path, case):
    folder = write_case(tmp_path / "fr", case)
    report = diagnose(load_dumps(folder))
    if case.verdict is None:
        assert report["suspects"] == [] and "agree" in report["diagnosis"], report["diagnosis"]
    else:
        first = report["suspects"][0]
        assert first["kind"] == case.verdict and first["rank"] in case.blame, report["diagnosis"]
        assert report["diagnosis"].startswith(f"Rank {first['rank']}")
    assert _pytorch_passes(folder) == (case.verdict is None)
