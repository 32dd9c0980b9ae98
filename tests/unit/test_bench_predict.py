"""The predicted = measured benchmarks' own bookkeeping (bench/predict.py, bench/predict_offline.py): which
runs a score reads, which pass's prediction a table row shows, how the passes' spread is read."""

from __future__ import annotations

import pytest

from bench.predict import _median_prediction
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
    from bench.predict import _spread, _spread_pct

    assert _spread_pct([0.010, 0.0125, 0.011]) == pytest.approx(25.0)
    assert _spread_pct([0.02]) == 0.0 and _spread_pct([]) == 0.0
    assert _spread([0.010, 0.0125]) == "10.0–12.5" and _spread([0.01]) == "one"
