"""profiler.collect.jobs with real processes: start in a process group of its own, exit codes recorded, cancel kills
the whole group, two jobs at once; and how profiler.collect.trace_sets reads a job's state next to its run.json.
The "profiler" here is a small Python script that writes run.json as `python -m profiler run` does;
the Run-a-job page is driven through AppTest with that script in place of the real command.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from profiler.collect import jobs, trace_sets
from tests.support.apptest import page_test, vega_charts
from ui.job_form import check

FAKE = textwrap.dedent("""
    # A stand-in for `python -m profiler run ... --out DIR`: run.json as the job advances.
    import json, os, sys, time
    out = sys.argv[sys.argv.index("--out") + 1]
    steps = int(os.environ.get("FAKE_STEPS", "3")); delay = float(os.environ.get("FAKE_DELAY", "0.2"))
    os.makedirs(out, exist_ok=True)
    def write(**run):
        tmp = os.path.join(out, ".run.json.tmp")
        with open(tmp, "w") as f:
            json.dump({"plan": {"dp": 2, "tp": 2}, "world_size": 4, **run}, f)
        os.replace(tmp, os.path.join(out, "run.json"))
    print("starting", flush=True)
    for step in range(steps + 1):
        write(status="running", progress={"step": step, "steps": steps})
        print(f"step {step}", flush=True)
        time.sleep(delay)
    if os.environ.get("FAKE_FAIL"):
        os.makedirs(os.path.join(out, "logs"), exist_ok=True)
        with open(os.path.join(out, "logs", "rank1.log"), "w") as f:
            f.write("RuntimeError: rank 1 gave up\\n")
        write(status="failed", error={"rank": 1, "message": "RuntimeError: rank 1 gave up"})
        sys.exit(1)
    write(status="completed", progress={"step": steps, "steps": steps})
""")


@pytest.fixture
def fake(tmp_path) -> Path:
    path = tmp_path / "fake_profiler.py"
    path.write_text(FAKE)
    return path


def _wait(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _env(**extra):
    return {**os.environ, **{k: str(v) for k, v in extra.items()}}


@pytest.mark.parametrize(
    "values, flags",
    [
        ({"dp": 2, "sp": True, "micro_batch": 1}, ["--dp", "2", "--sp", "--micro-batch", "1"]),
        ({"sp": False, "layers": None, "label": "", "wait": 0}, ["--wait", "0"]),
        ({"model": "tiny", "timeout": 60.0}, ["--model", "tiny", "--timeout", "60.0"]),
    ],
)
def test_flags_of(values, flags):
    assert jobs.flags_of(values) == flags


def test_profile_argv_is_the_profiler_run_command(tmp_path):
    argv = jobs.profile_argv(["--dp", "2"], tmp_path / "r")
    assert argv[1:] == ["-m", "profiler", "run", "--dp", "2", "--out", str(tmp_path / "r")]


def test_reserve_gives_distinct_names(tmp_path):
    names = {jobs.reserve(tmp_path, "DP2 TP2+SP") for _ in range(5)}
    assert len(names) == 5 and all("-dp2-tp2-sp" in n for n in names)
    (tmp_path / "x").mkdir()
    assert all((tmp_path / ".jobs" / f"{n}.json").is_file() for n in names)


def test_a_job_runs_in_the_background_and_its_exit_code_is_kept(tmp_path, fake):
    name = jobs.reserve(tmp_path, "ok")
    job = jobs.start(
        [sys.executable, str(fake), "--out", str(tmp_path / name)],
        name=name,
        runs_dir=tmp_path,
        env=_env(FAKE_STEPS=3, FAKE_DELAY=0.3),
    )
    assert os.getpgid(job.pid) == job.pid != os.getpgid(0)  # its own process group: not tied to ours
    assert jobs.alive(job)
    assert _wait(lambda: (s := trace_sets.find_set(name, runs=tmp_path)) is not None and s.status == "running")
    assert _wait(lambda: jobs.refresh(job).returncode is not None)
    done = jobs.refresh(job)
    assert done.returncode == 0 and not jobs.alive(done) and done.finished_at
    s = trace_sets.find_set(name, runs=tmp_path)
    assert s.status == "completed" and s.progress == 1.0 and s.world_size == 4
    assert "step 3" in jobs.tail(job.log_path)
    assert [j.name for j in jobs.jobs(tmp_path)] == [name]


def test_a_failing_job_names_its_rank(tmp_path, fake):
    name = jobs.reserve(tmp_path, "bad")
    job = jobs.start(
        [sys.executable, str(fake), "--out", str(tmp_path / name)],
        name=name,
        runs_dir=tmp_path,
        env=_env(FAKE_STEPS=1, FAKE_DELAY=0.05, FAKE_FAIL=1),
    )
    assert _wait(lambda: jobs.refresh(job).returncode is not None)
    s = trace_sets.find_set(name, runs=tmp_path)
    assert jobs.refresh(job).returncode == 1
    assert (s.status, s.error_rank, s.error) == ("failed", 1, "RuntimeError: rank 1 gave up")
    assert "gave up" in jobs.tail(s.rank_log(1))


def test_a_job_that_dies_before_run_json_is_failed_with_its_output(tmp_path):
    name = jobs.reserve(tmp_path, "crash")
    job = jobs.start(
        [sys.executable, "-c", "import sys; print('bad flag --tp 3'); sys.exit(2)"], name=name, runs_dir=tmp_path
    )
    assert _wait(lambda: jobs.refresh(job).returncode is not None)
    s = trace_sets.find_set(name, runs=tmp_path)
    assert s.status == "failed" and "exit code 2" in s.error and "before writing run.json" in s.error
    assert "bad flag --tp 3" in jobs.tail(s.job.log_path)


def test_cancel_kills_the_whole_process_group(tmp_path):
    child = tmp_path / "child.pid"
    script = (
        f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(child)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    name = jobs.reserve(tmp_path, "long")
    job = jobs.start([sys.executable, "-c", script], name=name, runs_dir=tmp_path)
    assert _wait(lambda: child.is_file() and child.read_text())
    grandchild = int(child.read_text())
    jobs.cancel(job, grace_s=2)
    assert _wait(lambda: jobs.refresh(job).returncode is not None, timeout=10)
    assert _wait(
        lambda: (
            not Path(f"/proc/{grandchild}").exists()
            or Path(f"/proc/{grandchild}/stat").read_text().split(")")[1].split()[0] == "Z"
        ),
        timeout=10,
    )
    done = jobs.refresh(job)
    assert done.cancelled and done.returncode < 0
    assert trace_sets.find_set(name, runs=tmp_path).status == "cancelled"
    assert jobs.cancel(done) == done  # a finished job is left alone


@pytest.mark.parametrize(
    "run_json, shown", [("running", "cancelled"), ("failed", "cancelled"), ("completed", "completed")]
)
def test_a_cancelled_job_still_cleaning_up_reads_cancelled(tmp_path, run_json, shown):
    """After a cancel, profiler run writes status failed ("stopped by signal 15") before its process
    exits; in that window the dashboard must already say cancelled, not failed (it stops polling then)."""
    me = os.getpid()
    job = jobs.Job(name="x", runs_dir=tmp_path, pid=me, pgid=me, start_ticks=jobs._start_ticks(me), cancelled=True)
    assert jobs.alive(job)
    assert trace_sets._job_status(run_json, job)[0] == shown


def test_two_jobs_at_once(tmp_path, fake):
    started = []
    for label in ("a", "b"):
        name = jobs.reserve(tmp_path, label)
        started.append(
            jobs.start(
                [sys.executable, str(fake), "--out", str(tmp_path / name)],
                name=name,
                runs_dir=tmp_path,
                env=_env(FAKE_STEPS=2, FAKE_DELAY=0.2),
            )
        )
    assert all(jobs.alive(j) for j in started)
    assert _wait(lambda: all(jobs.refresh(j).returncode == 0 for j in started))
    sets = trace_sets.list_sets(tmp_path, tmp_path / "uploads")
    assert {s.name for s in sets} == {j.name for j in started} and {s.status for s in sets} == {"completed"}


def test_a_recycled_pid_is_not_the_job(tmp_path):
    job = jobs.Job(name="x", runs_dir=tmp_path, pid=os.getpid(), pgid=os.getpid(), start_ticks=1)
    assert not jobs.alive(job)  # this pid is alive, but it started at another time
    assert jobs.cancel(job) == job


def test_run_a_job_page_starts_the_job_and_shows_it(tmp_path, fake, monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setenv("PARASCOPE_RUNS", str(runs))
    monkeypatch.setenv("FAKE_DELAY", "0.2")
    monkeypatch.setattr(
        jobs, "profile_argv", lambda flags, out, python=None: [sys.executable, str(fake), *flags, "--out", str(out)]
    )
    at = page_test("pages/run_job.py")
    assert not at.exception and "No jobs started from the dashboard yet." in [c.value for c in at.caption]
    batch = at.number_input(key="job.global_batch")  # empty, saying what it defaults to: never "0"
    assert batch.value is None and "dp × micro × pp" in batch.proto.placeholder
    at.number_input(key="job.tp").set_value(3)
    at.button[0].click().run()  # the form's submit button
    assert not at.exception
    assert any("heads 4 are not divisible by tp 3" in e.value for e in at.error)
    assert not (runs / ".jobs").exists() or not jobs.jobs(runs)  # nothing started
    at.number_input(key="job.tp").set_value(2)
    at.selectbox(key="job.cp_kind").set_value("ring")
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    (job,) = jobs.jobs(runs)
    assert any(f"Started **{job.name}**" in s.value for s in at.success)
    assert at.query_params["run"] == job.name
    command = " ".join(job.argv)
    assert "--model tiny --dp 2 --tp 2 --pp 2 --cp 1 --sp" in command and "--steps 4" in command
    assert "--cp-kind ring" in command and "--global-batch" not in command
    assert _wait(lambda: jobs.refresh(job).returncode == 0)
    at.run()
    assert any(job.name in m.value and "completed" in m.value for m in at.markdown)


# ------------------------------------------------------------------ the real profiler


def _real_profiler() -> None:
    pytest.importorskip("profiler.cli.run", reason="python -m profiler run is not in this checkout")


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_a_real_profile_run_from_the_dashboard_fills_the_timeline(tmp_path, monkeypatch):
    """`python -m profiler run` through profiler.collect.jobs: progress while it runs, then a completed run whose
    traces the Collective timeline draws."""
    _real_profiler()
    runs = tmp_path / "runs"
    monkeypatch.setenv("PARASCOPE_RUNS", str(runs))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    name = jobs.reserve(runs, "e2e")
    job = jobs.start(
        jobs.profile_argv(["--model", "tiny", "--dp", "2", "--tp", "2", "--sp", "--steps", "3"], runs / name),
        name=name,
        runs_dir=runs,
    )
    seen = set()
    assert _wait(
        lambda: seen.add(trace_sets.find_set(name).status) or jobs.refresh(job).returncode is not None, timeout=180
    )
    s = trace_sets.find_set(name)
    assert jobs.refresh(job).returncode == 0, jobs.tail(job.log_path)
    assert (
        s.status == "completed"
        and s.trace_files == 4
        and s.has_metrics
        and s.plan_label == "DP2 TP2+SP attn-unfused no-dropout"
    )
    assert seen & {"starting", "running"}
    at = page_test("pages/timeline.py", {"run": name})
    assert not at.exception, [e.value for e in at.exception]
    detail = vega_charts(at)[1].frame()
    assert sorted(detail["rank"].unique()) == [0, 1, 2, 3] and "sp" in set(detail["category"].astype(str))


@pytest.mark.slow
def test_cancelling_a_real_profile_run_leaves_no_process(tmp_path):
    _real_profiler()
    name = jobs.reserve(tmp_path, "cancel")
    job = jobs.start(
        jobs.profile_argv(["--model", "tiny", "--dp", "2", "--steps", "500"], tmp_path / name),
        name=name,
        runs_dir=tmp_path,
        env=_env(OMP_NUM_THREADS=1),
    )
    assert _wait(
        lambda: (
            (s := trace_sets.find_set(name, runs=tmp_path)) is not None and s.status == "running" and (s.step or 0) >= 1
        ),
        timeout=120,
    )
    jobs.cancel(job, grace_s=5)
    assert _wait(lambda: _group_gone(job.pgid), timeout=30)  # ranks included: the whole group is gone
    assert _wait(lambda: jobs.refresh(job).returncode is not None, timeout=10)
    s = trace_sets.find_set(name, runs=tmp_path)
    assert s.status == "cancelled" and ("SIGTERM" in s.error or s.error == "cancelled from the dashboard")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model", "tiny", "--dp", "2", "--tp", "3"], "heads 4 are not divisible by tp 3"),
        (["--model", "tiny", "--dp", "2", "--steps", "1", "--wait", "1", "--warmup", "1"], "record at least one step"),
        (["--model", "tiny", "--dp", "2", "--steps", "3"], None),
    ],
)
def test_the_form_is_checked_by_the_profilers_own_validation(flags, message):
    errors, _ = check(flags)
    assert any(message in e for e in errors) if message else errors == []


def test_the_vocabulary_is_either_refused_or_padded_never_both():
    """TP 3 on tiny (vocab 512) showed the engine's "does not pad the vocabulary" error
    beside the plan model's "the embedding is padded" warning."""
    errors, warnings = check(["--model", "tiny", "--heads", "3", "--hidden", "63", "--tp", "3"])
    assert any("does not pad the vocabulary" in e for e in errors), errors
    assert not any("the embedding is padded" in w for w in warnings), warnings
