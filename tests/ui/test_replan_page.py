"""AppTest of the Re-plan page over a real run directory (tests/ui/test_pages_runs' sample: a 4-rank
DP2 x TP2 + SP job of the tiny model): the job as identified, measured against modelled as one
stacked chart, the best plans as cards with their gain, a Plan review link that opens those plans,
and the launch files to download."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

from parallel.core.plan import Plan
from parallel.review.urls import review_from_params
from profiler import TraceAnalysis
from tests.support.apptest import page_test, vega_charts
from tests.ui.test_pages_runs import _ok, _text, _upload, install_run, runs  # noqa: F401 -- the runs fixture
from tests.unit.test_device_fit import MODEL, PLAN, SLOWER, gpu_job
from ui import replan_jobs


def test_replan_shows_the_job_the_gap_and_better_plans(runs):  # noqa: F811
    install_run(runs, "alpha")
    at = _ok(page_test("pages/replan.py", {"run": "alpha"}, timeout=120))
    text = _text(at)
    assert "The job, as identified" in text and "Measured against modelled" in text and "Re-planned" in text
    facts = at.dataframe[0].value
    assert {"plan", "model", "device"} <= set(facts["fact"])
    assert facts.set_index("fact").loc["plan", "source"] == "run.json"
    (chart,) = vega_charts(at)
    frame = chart.frame()
    assert set(frame["side"]) == {"measured", "modelled"} and "bar" in chart.marks()
    assert '"stack": "zero"' in chart.text()
    assert frame[frame["side"] == "modelled"]["seconds"].sum() > 0
    gains = [m for m in at.metric if m.label == "Gain over the measured step"]
    assert gains and all(g.value.endswith("%") for g in gains)
    links = [b for b in at.get("link_button")]
    assert links
    url = urlparse(links[0].proto.url)
    assert url.path == "plan_review"
    state = review_from_params({k: v if k == "plan" else v[0] for k, v in parse_qs(url.query).items()})
    assert [p.name for p in state.plans] == ["job", "re-planned"]
    assert state.plans[0].plan.dp == 2 and state.plans[0].plan.tp == 2
    assert isinstance(state.plans[1].plan, Plan) and state.plans[1].plan.world_size == 4
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Megatron-LM script" in labels and "torchtitan TOML" in labels


def test_replan_without_a_set_says_what_to_do(runs):  # noqa: F811
    at = _ok(page_test("pages/replan.py", {"run": "nowhere"}))
    assert "There is no run or uploaded set called" in _text(at)


def test_replan_of_an_uploaded_gpu_job(runs, tmp_path):  # noqa: F811
    folder = gpu_job(tmp_path / "job", SLOWER)
    files = [(p.name, p.read_bytes()) for p in sorted(folder.glob("rank*_trace.json"))]
    _upload("llama", files, PLAN, MODEL.name)
    at = _ok(page_test("pages/replan.py", {"run": "upload:llama"}, timeout=120))
    facts = at.dataframe[0].value.set_index("fact")
    assert facts.loc["device", "source"] == "deviceProperties" and facts.loc["plan", "source"] == "upload plan.json"
    assert "device_memory" in facts.index and facts.loc["device_memory", "source"] == "missing"
    assert any("could not be told" in w.value for w in at.warning)
    gains = [m for m in at.metric if m.label == "Gain over the measured step"]
    assert gains and gains[0].value.startswith("+")
    url = urlparse(at.get("link_button")[0].proto.url)
    state = review_from_params({k: v if k == "plan" else v[0] for k, v in parse_qs(url.query).items()})
    assert state.cluster == "dgx-h100" and state.model.name == MODEL.name


def test_a_cancelled_replan_stops_at_its_next_phase(tmp_path):
    front = TraceAnalysis.load(gpu_job(tmp_path / "job", SLOWER), cache=False)
    job = replan_jobs.Job()
    job.cancel.set()  # the Cancel button, before the thread reached its first phase
    replan_jobs._work(job, front, None)
    assert job.done and job.error == "cancelled" and job.result is None
    job = replan_jobs.Job()
    replan_jobs._work(job, front, None)
    assert job.done and job.error is None and job.result.plans and job.fraction == 0.9
