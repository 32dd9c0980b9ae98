"""The predicted = measured benchmarks' own bookkeeping (bench/predict.py, bench/predict_offline.py): which
runs a score reads, which pass's prediction a table row shows, how the passes' spread is read."""

from __future__ import annotations

import pytest

from bench.predict import _median_prediction, _spread, _spread_pct, repeatability
from bench.predict_offline import repetitions


def test_offline_score_reads_only_its_plans_repetitions(tmp_path):
    for name in ("cal-spcp-0", "cal-spcp-1", "cal-spcp-ring-0", "cal-spcp-ring-1", "cal-spcp-ring-2", "cal-pp2-3"):
        (tmp_path / name).mkdir()
    (tmp_path / "cal-spcp-2").write_text("a file, not a run")
    # cal-spcp-ring-N are another calibration plan's runs, not repetitions of spcp (they were read as
    # spcp #0/#1 again, doubling the combinations scored)
    assert repetitions(tmp_path, "spcp") == [0, 1]
    assert repetitions(tmp_path, "spcp-ring") == [0, 1, 2]
    assert repetitions(tmp_path, "pp2") == [3]
    assert repetitions(tmp_path, "cp2") == []


def test_a_rows_prediction_is_the_passes_median_with_its_own_phases():
    passes = [{"step_time_s": s, "compute_s": s / 2} for s in (0.30, 0.10, 0.20)]
    assert _median_prediction(passes) == {"step_time_s": 0.20, "compute_s": 0.10}
    # an even count: the lower middle one, a prediction that was made (not an average of two)
    assert _median_prediction(passes[:2])["step_time_s"] == 0.10
    assert _median_prediction(passes[:1]) is passes[0]


def test_pass_spread_is_slowest_over_fastest():
    assert _spread_pct([0.010, 0.0125, 0.011]) == pytest.approx(25.0)
    assert _spread_pct([0.02]) == 0.0 and _spread_pct([]) == 0.0
    assert _spread([0.010, 0.0125]) == "10.0–12.5" and _spread([0.01]) == "one"


def test_repeatability_floor_takes_each_pass_as_the_prediction_of_the_others():
    steady = [[0.010, 0.010], [0.010], [0.010, 0.010, 0.010]]  # every pass 10 ms: no error from any pass
    # pass 2 ran 30% slow: it misses the others (13 vs 10 ms: +30%); each of the others misses the median
    # of its others' steps {10, 13, 13} = 13 ms by -23.1%
    passes = {"a": steady, "b": steady, "c": [[0.010], [0.013, 0.013], [0.010]]}
    floor = repeatability(passes)
    per_pass = floor["per_pass"]
    assert [p["worst_pct"] for p in per_pass] == pytest.approx([300 / 13, 30.0, 300 / 13])
    assert [p["mae_pct"] for p in per_pass] == pytest.approx([100 / 13, 10.0, 100 / 13])
    assert floor["mae_pct"] == pytest.approx((200 / 13 + 10) / 3)
    assert floor["worst_pct"] == pytest.approx((600 / 13 + 30) / 3)
    assert floor["goal_met"] == 2  # pass 2's 10.0% mean is within the goal, its 30% worst is not
    # a plan run once has no other pass to predict: no floor from it, none at all without a second pass
    assert repeatability({"d": [[0.01]]}) == {}
    assert repeatability({**passes, "d": [[0.01]]}) == floor
