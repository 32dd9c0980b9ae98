"""The inter-node link of a calibration whose runs stayed on one node (`profiler calibrate --links`):
the traces' intra link plus what commbench measured the inter link to add over the intra one; and bench.predict's lab plans' bookkeeping."""

from __future__ import annotations

import pytest

from bench.predict_lab import LAB_HELD_BACK, cluster_flags, lab_error, world
from parallel.core.specs import Link
from profiler.analyzers.calibrate import _inter_from_commbench


def test_the_inter_link_is_the_traced_intra_one_plus_what_commbench_measured_it_to_add():
    links = {
        "intra": Link(1.0e9, 500e-6, "loopback"),  # bandwidth per rank per direction, latency per hop
        "inter": Link(0.25e9, 750e-6, "shaped veth"),
    }
    call, alpha, beta = _inter_from_commbench(links, call=2e-4, alpha=1e-3, beta=5e-9)
    # 250 us more a hop, 4 - 1 = 3 ns more a byte; the per-call host cost is the job's, the same
    assert (call, alpha, beta) == pytest.approx((2e-4, 1.25e-3, 8e-9))
    # an inter link commbench measured faster than the intra one adds nothing (never below the traces')
    fast = {"intra": links["inter"], "inter": links["intra"]}
    assert _inter_from_commbench(fast, 2e-4, 1e-3, 5e-9) == pytest.approx((2e-4, 1e-3, 5e-9))


def test_without_a_fitted_intra_link_all_of_commbenchs_inter_link_is_added():
    inter = Link(0.25e9, 750e-6, "shaped veth")
    assert _inter_from_commbench({"inter": inter}, 2e-4, 1e-3, 5e-9) == pytest.approx((2e-4, 1.75e-3, 9e-9))


def test_lab_plans_are_predicted_on_two_nodes_of_half_their_ranks():
    assert {n: world(f) for n, f in LAB_HELD_BACK.items()} == {
        "lab dp2": 2,
        "lab pp2": 2,
        "lab dp2 tp2": 4,
        "lab tp2 pp2": 4,
        "lab dp2 pp2": 4,
    }
    assert cluster_flags(LAB_HELD_BACK["lab dp2 tp2"]) == ["--cluster=local-cpu", "--nodes=2", "--gpus-per-node=2"]
    # no lab of that name (or no root): the bench says why instead of failing mid-run
    assert "lab" in lab_error("no-such-lab-") or "root" in lab_error("no-such-lab-")
