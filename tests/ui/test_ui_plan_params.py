"""parallel.review.urls: plan <-> URL query parameters, round trip and clear errors."""

import pytest

from parallel.core.plan import Plan
from parallel.core.specs import SpecError
from parallel.core.validate import check
from parallel.review.urls import DEFAULT_PARAMS, KEYS, plan_from_params, plan_to_params, usable_params


@pytest.mark.parametrize(
    "model, cluster, nodes, plan",
    [
        ("gpt3-175b", "dgx-h100", 64, Plan(dp=8, tp=8, pp=8, sp=True, global_batch=1536)),
        (
            "llama3-70b",
            "dgx-a100",
            16,
            Plan(
                dp=4,
                tp=8,
                pp=2,
                cp=2,
                micro_batch=2,
                global_batch=64,
                vpp=2,
                zero=1,
                recompute="selective",
                order="tp-cp-pp-dp",
            ),
        ),
        ("tiny", "local-cpu", 1, Plan(dp=2, tp=2, pp=2, global_batch=8, recompute="full")),
    ],
)
def test_round_trip(model, cluster, nodes, plan):
    params = plan_to_params(model, cluster, nodes, plan)
    # where the plan runs, its degrees and global batch always; every other field where it differs from its default
    assert set(params) <= set(KEYS) and {"model", "cluster", "nodes", "gpn", "dp", "tp", "pp", "gb"} <= set(params)
    assert all(isinstance(v, str) for v in params.values())
    m, c, p = plan_from_params(params)
    assert (m.name, c.name, c.nodes, p) == (model, cluster, nodes, plan)


def test_defaults_and_fitted_nodes():
    m, c, p = plan_from_params({})
    assert plan_to_params(m.name, c.name, c.nodes, p) == DEFAULT_PARAMS
    _, c, p = plan_from_params({"dp": "2", "tp": "8", "pp": "1", "unrelated": "x"})
    assert c.nodes == 2 and p.world_size == 16  # no `nodes`: just enough for the plan
    _, c, _ = plan_from_params({"dp": ["1", "2"], "nodes": ["3"]})  # parse_qs lists: last wins
    assert c.nodes == 3


@pytest.mark.parametrize(
    "params, message",
    [
        ({"tp": "eight"}, "tp='eight' must be an integer"),
        ({"sp": "yes"}, "sp='yes' must be 0 or 1"),
        ({"model": "gpt5"}, "unknown model preset 'gpt5'"),
        ({"cluster": "tpu"}, "unknown cluster preset 'tpu'"),
        ({"zero": "4"}, "zero='4' must be one of 0, 1, 2, 3"),
        ({"recompute": "some"}, "recompute='some' must be one of"),
        ({"order": "tp-dp"}, "must name each of tp, cp, dp, pp"),
        ({"dp": "0"}, "dp='0' must be a positive integer"),
        ({"nodes": "0"}, "nodes=0 must be at least 1"),
    ],
)
def test_bad_values_raise_spec_error(params, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        plan_from_params(params)


def test_usable_params_keeps_the_good_keys():
    good, errors = usable_params({"model": "gpt3-22b", "tp": "x", "sp": "2", "dp": "4", "other": "y"})
    assert good == {"model": "gpt3-22b", "dp": "4"}
    assert len(errors) == 2 and "tp='x'" in errors[0] and "sp='2'" in errors[1]


def test_gpus_per_node_rides_in_the_url_so_small_runs_fit_their_cluster():
    params = plan_to_params("tiny", "local-cpu", 1, Plan(dp=2, tp=2, global_batch=8), gpus_per_node=4)
    assert params["gpn"] == "4"
    model, cluster, plan = plan_from_params(params)
    assert (cluster.nodes, cluster.gpus_per_node) == (1, 4)
    assert check(plan, model, cluster).valid
    # without gpn the preset's 8 GPUs per node stand, and the size mismatch is named
    _, cluster8, _ = plan_from_params({k: v for k, v in params.items() if k != "gpn"})
    assert cluster8.gpus_per_node == 8 and not check(plan, model, cluster8).valid
