"""Flags and files a user can get wrong, each refused in one line before any work: a step count past
any profile, a job timeout that never fires, an --out that is a folder or in none, a device fit whose
device is not a name, efficiencies too small to divide by, and a search too large to lay out."""

import json
import math
import time

import pytest

from parallel.cli import search as search_cli
from parallel.core.devices import MIN_EFFICIENCY, device_from_fit
from parallel.core.specs import SpecError
from profiler.cli import calibrate as calibrate_cli
from profiler.collect.spec import MAX_STEPS, parse_run

RUN = ["--model=tiny", "--dp=2", "--global-batch=4"]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--steps", str(10**30)], f"--steps {10**30}: at most {MAX_STEPS:,} steps"),
        (["--steps", "8", "--active", str(10**22)], f"--active {10**22}: at most {MAX_STEPS:,} steps"),
        (["--job-timeout", "nan"], "--job-timeout nan must be a number of seconds > 0"),
        (["--job-timeout", "inf"], "--job-timeout inf must be a number of seconds > 0"),
        (["--job-timeout", "0"], "--job-timeout 0.0 must be a number of seconds > 0"),
    ],
)
def test_profiler_run_refuses_unbounded_steps_and_timeouts(flags, words):
    _, errors, _ = parse_run([*RUN, *flags])
    assert any(words in e for e in errors), errors


def test_a_bounded_run_still_parses():
    spec, errors, _ = parse_run([*RUN, "--steps", "6", "--job-timeout", "30.5"])
    assert errors == [] and spec.job_timeout_s == 30.5 and math.isfinite(spec.job_timeout_s)


@pytest.mark.parametrize("kernels", [[], ["--kernels"]], ids=["steps", "kernels"])
def test_calibrate_out_into_a_missing_folder_or_onto_one(tmp_path, capsys, kernels):
    for out, words in ((tmp_path / "none" / "calib.json", "which is not a folder"), (tmp_path, "is a folder")):
        assert calibrate_cli.main([str(tmp_path), *kernels, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("fit", "words"),
    [
        ({"device": ["h100-sxm"]}, "unknown device ['h100-sxm']"),
        ({"device": {"name": "h100-sxm"}}, "unknown device"),
        ({"device": "h100-sxm", "gemm_efficiency": 5e-324}, f"must be a number in [{MIN_EFFICIENCY}, 1]"),
    ],
)
def test_a_device_fit_of_the_wrong_shape(fit, words):
    with pytest.raises(SpecError, match=None) as err:
        device_from_fit(fit)
    assert words in str(err.value)


@pytest.mark.parametrize("flag", ["--mfu", "--job-efficiency"])
def test_an_efficiency_too_small_to_divide_by(capsys, flag):
    argv = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch", "64", "--explain"]
    assert search_cli.main([*argv, flag, "5e-324"]) == 2
    assert f"{flag} must be in [{MIN_EFFICIENCY}, 1], got 5e-324" in capsys.readouterr().err


def test_a_search_too_large_to_lay_out_is_refused_quickly(capsys):
    start = time.perf_counter()
    code = search_cli.main(["--model", "llama3-405b", "--gpus", "1048576", "--global-batch", "2048", "--explain"])
    assert code == 2 and time.perf_counter() - start < 30
    err = capsys.readouterr().err
    assert "distinct layouts of 1,048,576 ranks each are past the search's budget" in err, err


def test_a_device_fit_file_with_a_list_device_is_one_line(tmp_path, capsys):
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"device": ["h100-sxm"]}))
    argv = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch", "64"]
    assert search_cli.main([*argv, "--device-fit", str(path)]) == 2
    assert "unknown device" in capsys.readouterr().err
