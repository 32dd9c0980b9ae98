"""The NVLink domain as a cluster property: the Cluster's rule (whole hosts), the `--nvlink-domain` flag
of `parallel plan` / `parallel search`, the `nvl` URL key, and the Topology page's domain data
(parallel.core.rank_grid)."""

import dataclasses
import json

import pytest

from parallel.cli import plan as plan_cli
from parallel.cli import search as search_cli
from parallel.core import rank_grid
from parallel.core.plan import Plan
from parallel.core.specs import CLUSTERS, SpecError
from parallel.core.topology import placed
from parallel.review.urls import plan_from_params, plan_to_params, usable_params

DGX, NVL72 = CLUSTERS["dgx-h100"], CLUSTERS["gb200-nvl72"]
GPT3 = "--model gpt3-175b --dp 8 --tp 8 --pp 8 --sp --global-batch 1536 --json".split()


# ---------------------------------------------------------------- the Cluster's rule


@pytest.mark.parametrize(
    "gpus_per_node, domain, message",
    [
        (4, 6, "an NVLink domain is whole hosts: dgx-h100's 6 GPUs per NVLink domain is not a multiple of its 4"),
        (8, 4, "is not a multiple of its 8 GPUs per node"),
        (8, 0, "Cluster.nvlink_domain must be a positive integer, got 0"),
        (8, -8, "Cluster.nvlink_domain must be a positive integer, got -8"),
        (8, True, "Cluster.nvlink_domain must be a positive integer, got True"),
    ],
)
def test_a_domain_that_is_not_whole_hosts_is_refused(gpus_per_node, domain, message):
    with pytest.raises(SpecError, match=message):
        dataclasses.replace(DGX, gpus_per_node=gpus_per_node, nvlink_domain=domain)


def test_a_launch_keeps_the_domain_while_it_is_whole_hosts():
    assert NVL72.launched_as(2).nvlink_domain == 72  # 36 hosts of 2
    assert NVL72.launched_as(5).nvlink_domain is None  # 72 is no whole number of hosts of 5: one host
    assert NVL72.sized_for(3).domain_gpus == 72 and NVL72.sized_for(3).gpus_per_node == 3
    sixteen = dataclasses.replace(DGX, nvlink_domain=16)
    assert sixteen.sized_for(5).gpus_per_node == 5 and sixteen.sized_for(5).nvlink_domain is None
    assert sixteen.sized_for(64).nvlink_domain == 16


# ---------------------------------------------------------------- the CLI flag


def _plan_json(capsys, *argv) -> dict:
    code = plan_cli.main([*argv, *GPT3])
    rep = json.loads(capsys.readouterr().out)
    assert code in (0, 2), rep
    return rep


def test_a_domain_of_two_hosts_brings_tp8_back_onto_nvlink(capsys):
    """TP 8 on hosts of 4 GPUs crosses hosts; a domain of 8 GPUs (two hosts) keeps it on NVLink."""
    hosts = _plan_json(capsys, "--cluster", "dgx-h100", "--gpus-per-node", "4")
    domain = _plan_json(capsys, "--cluster", "dgx-h100", "--gpus-per-node", "4", "--nvlink-domain", "8")
    assert hosts["cluster"]["nvlink_domain"] is None and domain["cluster"]["nvlink_domain"] == 8
    assert hosts["groups"]["tp"][0] == {"ranks": list(range(8)), "nodes": [0, 1], "domains": [0, 1], "link": "inter"}
    assert domain["groups"]["tp"][0] == {"ranks": list(range(8)), "nodes": [0, 1], "domains": [0], "link": "intra"}
    assert {r["link"] for r in domain["comm_per_step"] if r["dim"] == "tp"} == {"intra"}
    exposed, on_nvlink = hosts["step_time"]["exposed_tp_s"], domain["step_time"]["exposed_tp_s"]
    assert on_nvlink < exposed / 2  # 450 GB/s NVLink instead of 50 GB/s InfiniBand
    assert domain["step_time_s"] < hosts["step_time_s"]


def test_gpus_per_node_alone_keeps_the_presets_domain(capsys):
    rep = _plan_json(capsys, "--cluster", "gb200-nvl72", "--gpus-per-node", "2")
    assert (rep["cluster"]["gpus_per_node"], rep["cluster"]["nvlink_domain"]) == (2, 72)
    assert rep["groups"]["tp"][0]["link"] == "intra"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--cluster", "dgx-h100", "--gpus-per-node", "4", "--nvlink-domain", "6"], "is not a multiple of its 4 GPUs"),
        (["--cluster", "dgx-h100", "--nvlink-domain", "0"], "nvlink_domain must be a positive integer, got 0"),
        (["--cluster", "dgx-h100", "--nvlink-domain", "-16"], "nvlink_domain must be a positive integer, got -16"),
        (["--cluster", "gb200-nvl72", "--gpus-per-node", "5"], "gb200-nvl72's 72 GPUs per NVLink domain"),
    ],
)
def test_a_bad_domain_is_one_line_and_exit_code_2(capsys, argv, words):
    code = plan_cli.main([*argv, *GPT3[:-1]])
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.count("\n") == 1 and "Traceback" not in err
    assert search_cli.main([*argv, "--model", "llama3-8b", "--gpus", "64", "--global-batch", "64"]) == 2
    assert words in capsys.readouterr().err


def test_search_plans_on_the_given_domain(capsys):
    """On hosts of 4 GPUs, 8-GPU NVLink domains put twice as many ranks on NVLink: the best plan is faster."""
    argv = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus-per-node", "4", "--gpus", "64"]
    argv += ["--global-batch", "256", "--top", "1", "--json"]
    assert search_cli.main(argv) == 0
    (hosts,) = json.loads(capsys.readouterr().out)
    assert search_cli.main([*argv, "--nvlink-domain", "8"]) == 0
    (domains,) = json.loads(capsys.readouterr().out)
    assert domains["step_time_s"] < hosts["step_time_s"]


# ---------------------------------------------------------------- the URL key


def test_the_domain_rides_in_the_url_only_when_it_is_not_the_presets():
    plan = Plan(dp=8, tp=8, global_batch=64)
    assert "nvl" not in plan_to_params("gpt3-22b", "gb200-nvl72", 16, plan, 4, nvlink_domain=72)
    assert "nvl" not in plan_to_params("gpt3-22b", "dgx-h100", 16, plan, 4, nvlink_domain=4)
    params = plan_to_params("gpt3-22b", "dgx-h100", 16, plan, 4, nvlink_domain=8)
    assert params["nvl"] == "8"
    _, cluster, _ = plan_from_params(params)
    assert (cluster.gpus_per_node, cluster.domain_gpus) == (4, 8)
    _, cluster, _ = plan_from_params({"cluster": "gb200-nvl72"})  # a link to an NVL72 preset
    assert (cluster.gpus_per_node, cluster.domain_gpus) == (4, 72)


def test_a_url_domain_is_checked_beside_its_hosts():
    good, errors = usable_params({"cluster": "dgx-h100", "gpn": "4", "nvl": "12"})
    assert good == {"cluster": "dgx-h100", "gpn": "4", "nvl": "12"} and not errors
    good, errors = usable_params({"cluster": "gb200-nvl72", "gpn": "5", "nvl": "10"})  # valid only together
    assert good == {"cluster": "gb200-nvl72", "gpn": "5", "nvl": "10"} and not errors
    good, errors = usable_params({"cluster": "dgx-h100", "gpn": "4", "nvl": "6"})
    assert good == {"cluster": "dgx-h100", "gpn": "4"} and errors == [
        "an NVLink domain is whole hosts: dgx-h100's 6 GPUs per NVLink domain is not a multiple of its 4 GPUs per node"
    ]
    good, errors = usable_params({"cluster": "gb200-nvl72", "gpn": "5"})
    assert good == {"cluster": "gb200-nvl72"} and "72 GPUs per NVLink domain" in errors[0]
    with pytest.raises(SpecError, match="nvl=0 must be at least 1"):
        plan_from_params({"nvl": "0"})


# ---------------------------------------------------------------- the Topology page's domain data


def test_144_gb200_gpus_are_two_racks_of_18_hosts():
    topo = placed(Plan(dp=144, global_batch=144), NVL72.sized_for(144))
    spans = rank_grid.domain_spans(topo)
    assert spans[["domain", "first_node", "last_node", "gpus"]].values.tolist() == [[0, 0, 17, 72], [1, 18, 35, 72]]
    assert spans["label"].tolist() == [
        "NVLink domain (rack) 0: nodes 0–17, 72 GPUs",
        "NVLink domain (rack) 1: nodes 18–35, 72 GPUs",
    ]
    assert spans[["x0", "x1"]].values.tolist() == [[-0.5, 17.5], [17.5, 35.5]]
    window = rank_grid.domain_spans(topo, first_node=10, nodes=10)  # nodes 10-19: both, clipped
    assert window[["x0", "x1"]].values.tolist() == [[9.5, 17.5], [17.5, 19.5]]
    assert "2 NVLink domains (racks) of 18 nodes × 4 GPUs = 72 GPUs" in rank_grid.domain_note(topo)
    cells = rank_grid.gpu_cells(topo, group_dim="dp", compare_order=topo.order)
    assert cells.loc[cells["node"] == 17, "domain"].eq(0).all() and cells.loc[cells["node"] == 18, "domain"].eq(1).all()
    assert rank_grid.node_overview(topo, "dp")["domain"].tolist() == [0] * 18 + [1] * 18


def test_on_a_dgx_a_domain_is_a_host():
    topo = placed(Plan(dp=4, tp=8, global_batch=64), DGX.sized_for(32))
    spans = rank_grid.domain_spans(topo)
    assert (spans["first_node"] == spans["last_node"]).all() and spans["domain"].tolist() == [0, 1, 2, 3]
    assert spans["label"].iloc[1] == "NVLink domain 1: node 1, 8 GPUs"
    assert (
        rank_grid.domain_note(topo)
        == "NVLink domain = one node (8 GPUs): a group stays on NVLink only inside its node."
    )


@pytest.mark.parametrize("cluster, link", [(NVL72, "intra"), (dataclasses.replace(NVL72, nvlink_domain=4), "inter")])
def test_a_group_across_hosts_of_one_rack_is_drawn_on_nvlink(cluster, link):
    """TP 8 over two 4-GPU trays: NVLink inside a rack; InfiniBand when each tray is its own domain."""
    topo = placed(Plan(dp=18, tp=8, global_batch=18), cluster.sized_for(144))
    names = {"intra": "intra", "inter": "inter"}
    cells = rank_grid.gpu_cells(topo, group_dim="tp", compare_order=topo.order, names=names)
    paths = rank_grid.group_paths(topo, "tp", names=names)
    assert set(cells["group_link"]) == set(paths["link"]) == {link}
    summary = rank_grid.dim_summary(topo, "tp-cp-pp-dp").set_index("dimension")
    assert summary.loc["TP", "crossing domains"] == (0 if link == "intra" else 18)


def test_the_groups_table_counts_expert_groups_across_racks():
    """Qwen3-30B-A3B's EP 16 beside TP 8 on 32 trays (128 GPUs, a rack of 72 and one of 56): every expert
    group strides over both racks, so all 8 cross a domain; the TP groups of two trays stay in theirs."""
    topo = placed(Plan(dp=16, tp=8, sp=True, ep=16, global_batch=512), NVL72.with_nodes(32))
    summary = rank_grid.dim_summary(topo, "tp-cp-pp-dp", ("NVLink", "InfiniBand")).set_index("dimension")
    assert list(summary.index) == ["TP", "CP", "EP", "PP", "DP"]
    assert summary.loc["EP", ["size", "groups", "crossing domains", "link"]].tolist() == [16, 8, 8, "InfiniBand"]
    assert summary.loc["TP", ["crossing domains", "link"]].tolist() == [0, "NVLink"]
    dense = rank_grid.dim_summary(placed(Plan(dp=16, tp=8, global_batch=16), NVL72.with_nodes(32)), topo.order)
    assert "EP" not in set(dense["dimension"])
