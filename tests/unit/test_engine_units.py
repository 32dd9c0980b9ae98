"""The engine's pieces in one process: sharding, token layout, operators, optimizer, activation meter, CLI errors.

Multi-process correctness (every plan against the serial model) is tests/integration/test_engine_matrix.py.
"""

import dataclasses
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from parallel.cli.train import config_from_args
from parallel.core import memory
from parallel.core.plan import Plan
from parallel.core.specs import MODELS
from parallel.engine import data
from parallel.engine.actmem import ActivationMeter, predicted_breakdown
from parallel.engine.api import engine_errors
from parallel.engine.collectives import BlockedClock, Group
from parallel.engine.context_parallel import causal_bias, sp_ranges, token_ranges
from parallel.engine.dist import ParallelContext, local_context
from parallel.engine.gpt import GPTStage, LayerNorm, full_shapes, init_tensor
from parallel.engine.optim import AdamW
from parallel.engine.tensor_parallel import shard_tensor, unshard_tensor, vocab_parallel_cross_entropy
from profiler.collect.spec import parse_run
from tests.conftest import ROOT

TINY = MODELS["tiny"]


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("axis,parts", [(0, (64, 32, 32)), (0, (256,)), (1, (64,))])
def test_shard_unshard_round_trip(tp, axis, parts):
    shape = (sum(parts), 8) if axis == 0 else (8, sum(parts))
    full = torch.randn(shape)
    shards = [shard_tensor(full, axis=axis, parts=parts, index=i, size=tp) for i in range(tp)]
    assert all(s.shape[axis] == sum(parts) // tp for s in shards)
    torch.testing.assert_close(unshard_tensor(shards, axis=axis, parts=parts), full, rtol=0, atol=0)


def test_qkv_shard_keeps_heads_together():
    """TP rank i gets rows of q, k and v for the same heads: [q_i | k_i | v_i]."""
    h = 8
    full = torch.arange(3 * h).float().unsqueeze(1)  # row r holds r
    s1 = shard_tensor(full, axis=0, parts=(h, h, h), index=1, size=2).squeeze(1).tolist()
    assert s1 == [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_token_layout_covers_the_sequence_once(cp, tp):
    s = 64
    seen = []
    for c in range(cp):
        ranges = token_ranges(seq_len=s, cp=cp, index=c)
        assert sum(b - a for a, b in ranges) == s // cp
        for t in range(tp):
            for a, b in sp_ranges(ranges, tp=tp, index=t):
                seen.extend(range(a, b))
    assert sorted(seen) == list(range(s))


def test_load_balanced_chunks_and_causal_mask():
    assert token_ranges(seq_len=64, cp=2, index=0) == [(0, 16), (48, 64)]
    assert token_ranges(seq_len=64, cp=2, index=1) == [(16, 32), (32, 48)]
    # rank 0's queries at positions 0..15 and 48..63 against keys of ranks 0, 1 (0-15, 48-63, 16-47)
    bias = causal_bias(seq_len=64, cp=2, index=0)
    assert bias.shape == (32, 64)
    allowed = (bias == 0).sum(1)
    assert allowed[0] == 1 and allowed[15] == 16  # first chunk: causal within itself
    assert allowed[16] == 49 and allowed[31] == 64  # position 48 sees 0..48; 63 sees everything
    # equal work on both ranks: the point of the 2*cp chunking
    assert int((bias == 0).sum()) == int((causal_bias(seq_len=64, cp=2, index=1) == 0).sum())


def test_vocab_parallel_cross_entropy_matches_torch():
    ctx = local_context()
    logits = torch.randn(2, 5, 11, requires_grad=True)
    target = torch.randint(11, (2, 5))
    ours = vocab_parallel_cross_entropy(logits, target, start=0, group=ctx.tp)
    ref = F.cross_entropy(logits.view(-1, 11), target.view(-1), reduction="none").view(2, 5)
    torch.testing.assert_close(ours, ref)
    w = torch.randn(2, 5)
    (g1,) = torch.autograd.grad((ours * w).sum(), logits)
    (g2,) = torch.autograd.grad((ref * w).sum(), logits)
    torch.testing.assert_close(g1, g2)


def test_layernorm_keeps_only_its_input_and_matches_torch():
    x = torch.randn(2, 7, 16, requires_grad=True)
    ln = LayerNorm(16, sp=False)
    with torch.no_grad():
        ln.weight.normal_(), ln.bias.normal_()
    y = ln(x)
    gx, gw, gb = torch.autograd.grad(y.square().sum(), (x, ln.weight, ln.bias))
    ref = F.layer_norm(x, (16,), ln.weight, ln.bias, 1e-5)
    rx, rw, rb = torch.autograd.grad(ref.square().sum(), (x, ln.weight, ln.bias))
    for a, b in ((y, ref), (gx, rx), (gw, rw), (gb, rb)):
        torch.testing.assert_close(a, b)


def test_adamw_is_torch_adamw_bit_for_bit():
    torch.manual_seed(0)
    p1 = torch.nn.Parameter(torch.randn(50))
    p2 = torch.nn.Parameter(p1.detach().clone())
    theirs = torch.optim.AdamW([p1], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ours = AdamW([p2], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for _ in range(4):
        g = torch.randn(50)
        p1.grad, p2.grad = g.clone(), g.clone()
        theirs.step()
        ours.step()
    torch.testing.assert_close(p2, p1, rtol=0, atol=0)


def test_init_is_a_function_of_seed_and_name():
    a = init_tensor("h.0.attn.c_attn.weight", (192, 64), seed=0, layers=4)
    assert torch.equal(a, init_tensor("h.0.attn.c_attn.weight", (192, 64), seed=0, layers=4))
    assert not torch.equal(a, init_tensor("h.1.attn.c_attn.weight", (192, 64), seed=0, layers=4))
    assert abs(a.std().item() - 0.02) < 0.002
    assert set(full_shapes(TINY)) == {n for n, _ in GPTStage(model=TINY, ctx=local_context()).named_parameters()}


# ---- activation memory: the meter against memory.py, exactly ------------------------------------


@pytest.mark.parametrize(
    "plan_kw,model_kw,dropout",
    [
        ({}, {}, 0.0),
        ({}, {}, 0.1),
        ({"recompute": "selective"}, {}, 0.1),
        ({"recompute": "full"}, {}, 0.1),
        ({"micro_batch": 2, "global_batch": 2}, {"kv_heads": 2}, 0.1),  # GQA, two sequences per microbatch
        (
            {},
            {"layers": 2, "hidden": 96, "heads": 6, "kv_heads": 6, "ffn_hidden": 200, "seq_len": 48, "vocab": 300},
            0.0,
        ),
    ],
    ids=["plain", "dropout", "selective", "recompute-all", "gqa-mb2", "other-shape"],
)
def test_meter_equals_formula_in_one_process(plan_kw, model_kw, dropout):
    plan = Plan(**plan_kw)
    model = dataclasses.replace(TINY, **model_kw)
    stage = GPTStage(model=model, ctx=local_context(plan), dropout=dropout)
    stage.init_weights(seed=0)
    meter = ActivationMeter(exclude=list(stage.parameters()))
    batch = data.global_batch(step=0, seed=0, global_batch=plan.global_batch, seq_len=model.seq_len, vocab=model.vocab)
    mb = data.microbatches(batch, plan=plan, dp_index=0, cp_index=0)[0]
    with meter.measure(inputs=list(mb.values())):
        loss = stage(ids=mb["ids"], targets=mb["targets"], tokens=model.seq_len)
    loss.backward()  # the saved tensors are the ones backward needs
    predicted = predicted_breakdown(model, plan, stage=0, dropout=dropout)
    assert meter.breakdown() == pytest.approx(predicted, rel=0, abs=0)
    assert "other" not in meter.breakdown()
    assert set(meter.per_layer()) == set(range(model.layers))


def test_meter_counts_a_shared_storage_once_and_skips_parameters():
    w = torch.nn.Parameter(torch.randn(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    meter = ActivationMeter(exclude=[w])
    with meter.measure():
        y = x @ w  # saves x and w
        z = (y * y).sum() + (y.sin()).sum()  # y saved twice (mul saves both operands), sin saves y
    z.backward()
    assert meter.total() == 4 * 8 * 4 + 4 * 8 * 4  # x and y, once each; w excluded


# ---- CLI: bad plans exit 2 before any process starts --------------------------------------------


def test_engine_errors_name_what_is_missing():
    assert engine_errors(TINY, Plan(tp=2)) == []
    assert engine_errors(MODELS["tiny-llama"], Plan(tp=8, cp=2, cp_kind="ring")) == []  # K/V heads replicated
    msgs = engine_errors(
        dataclasses.replace(TINY, arch="llama", tie_embeddings=True, kv_heads=2, vocab=511),
        Plan(pp=2, tp=3, vpp=2, zero=2),
    )
    assert any("untied output layer" in m for m in msgs) and any("kv_heads 2 and tp 3" in m for m in msgs)
    assert any("vocab 511" in m for m in msgs) and not any("ZeRO" in m for m in msgs)  # ZeRO 0-3 all run


def test_validating_a_train_command_does_not_import_torch():
    code = (
        "import sys\nfrom parallel.cli.train import config_from_args\n"
        "cfg, errors, _ = config_from_args(['--dp', '2', '--tp', '2', '--sp', '--global-batch', '4'])\n"
        "assert not errors, errors\nprint(any(m.split('.')[0] == 'torch' for m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--tp", "3"], "heads 4 are not divisible by tp 3"),
        (["--sp"], "sequence parallelism (sp) needs tp > 1"),
        (["--dp", "2", "--global-batch", "3"], "global_batch 3 is not divisible"),
        (["--pp", "2", "--vpp", "2", "--global-batch", "3"], "interleaved schedule: microbatches 3"),
        (["--zero", "4", "--dp", "2"], "--zero: invalid choice: 4"),
        (["--zero", "3"], None),  # ZeRO-3 at dp 1 is allowed (one shard is the whole)
        (["--dp", "2", "--global-batch", "2", "--timeout", "-1"], "--timeout -1 must be > 0"),  # was gloo's traceback
        (["--tp", "2", "--layers", "3"], None),  # fine for TP: not an error
        (["--dp", "2", "--straggler", "2:10"], "rank 2 is outside 0..1"),
        (["--dp", "2", "--straggler", "1"], "expected RANK:MS"),
        (["--dp", "2", "--straggler", "1:-5"], "the delay must be 0-60000 ms"),
        (["--dp", "2", "--straggler", "1:20"], None),
    ],
)
def test_cli_rejects_a_bad_plan_with_exit_2(flags, needle, tmp_path):
    start = time.monotonic()
    args = ["--out", str(tmp_path / "run"), "--steps", "1"]
    if needle is None:  # only check that the plan model does not object; do not train
        _, errors, _ = config_from_args(flags + args)
        assert errors == []
        return
    r = subprocess.run(
        [sys.executable, "-m", "parallel", "train", *flags, *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()  # nothing ran
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("out,needle", [("file", "exists and is not a directory"), ("file/run", "cannot be created (")])
def test_an_out_that_cannot_hold_the_run_exits_2_before_any_rank_starts(out, needle, tmp_path):
    """rank 0 writes metrics.json only after the last step: a bad --out must not cost the whole job."""
    (tmp_path / "file").write_text("")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "parallel",
            "train",
            "--dp",
            "2",
            "--global-batch",
            "2",
            "--steps",
            "1",
            "--out",
            str(tmp_path / out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "step 0" not in r.stdout


def _stage_context(plan: Plan, *, stage: int, tp_index: int = 0):
    """One rank's ParallelContext of `plan` without torch.distributed: groups sized as the plan's (no
    collective is issued while a stage is built)."""
    topo = plan.topology(plan.world_size)
    rank = topo.rank_of(pp=stage, tp=tp_index)
    groups = {}
    for name, dim in (("tp", "tp"), ("cp", "cp"), ("pp", "pp"), ("dp", "dp")):
        ranks = next(row for row in topo.group_ranks(dim) if rank in row)
        groups[name] = Group(dim=dim, ranks=ranks, pg=None, rank=rank)
    one = {n: Group(dim=d, ranks=(rank,), pg=None, rank=rank) for n, d in (("dpcp", "dp"), ("emb", "pp"), ("kv", "tp"))}
    return ParallelContext(
        plan=plan,
        topo=topo,
        rank=rank,
        world_size=plan.world_size,
        device=torch.device("cpu"),
        backend="none",
        **groups,
        **one,
    )


@pytest.mark.parametrize(
    "model, plan",
    [
        (TINY, Plan(tp=2, pp=2, global_batch=4)),
        (MODELS["tiny-llama"], Plan(tp=2, pp=2, global_batch=4)),
        (dataclasses.replace(MODELS["tiny-llama"], kv_heads=2), Plan(tp=4, pp=2, global_batch=4)),  # K/V replicated
        (dataclasses.replace(TINY, kv_heads=2), Plan(tp=4, global_batch=4)),  # GQA GPT, with biases
    ],
)
def test_params_per_stage_counts_the_engines_parameters(model, plan):
    """memory.params_per_stage is what a stage of the engine holds, including a shared K/V head per
    rank when tp > kv_heads."""
    for stage in range(plan.pp):
        built = GPTStage(model=model, ctx=_stage_context(plan, stage=stage))
        assert sum(p.numel() for p in built.parameters()) == memory.params_per_stage(model, plan, stage)


def test_a_launch_is_validated_on_the_machines_it_runs_on(monkeypatch):
    """12 local ranks with TP 3 were checked against local-cpu's 8-rank nodes, and warned
    that TP crossed 'nodes' of one machine. The local launcher is one node; torchrun's nodes are
    world / LOCAL_WORLD_SIZE; --gpus-per-node still wins."""
    flags = "--tp 3 --heads 6 --hidden 96 --vocab 513 --dp 4".split()
    _, errors, warnings = config_from_args(flags)
    assert errors == [] and not any("cross nodes" in w for w in warnings)
    spec, _, warnings = parse_run([*flags, "--steps", "3", "--out", "/tmp/unused"])
    assert (spec.cluster.nodes, spec.cluster.gpus_per_node) == (1, 12) and not any("cross" in w for w in warnings)
    _, _, warnings = config_from_args([*flags, "--gpus-per-node", "8"])  # said by the user: checked as said
    assert any("TP groups cross nodes" in w for w in warnings)
    for k, v in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(k, v)  # torchrun: 3 nodes of 4 ranks, TP 3 crosses them
    _, _, warnings = config_from_args(flags)
    assert any("TP groups cross nodes" in w for w in warnings)


def test_the_blocked_clock_counts_open_ranges_once():
    """collectives.BlockedClock: the union of the communication ranges open at once (an exchange's
    send and receive labels), and `take` returns the seconds since the last take; `take_cpu` the
    process's CPU seconds inside them."""
    clock = BlockedClock()
    clock.enter()
    time.sleep(0.02)
    clock.enter()  # a second range inside the first: no time of its own
    time.sleep(0.02)
    clock.exit()
    clock.exit()
    time.sleep(0.03)  # outside every range: not counted
    first = clock.take()
    assert 0.04 <= first < 0.07
    assert clock.take() == 0.0
    assert clock.take_cpu() < 0.01  # asleep inside the ranges: waiting costs no CPU
    clock.enter()
    t0 = time.process_time()
    while time.process_time() - t0 < 0.03:  # busy inside a range: its CPU counts
        pass
    clock.exit()
    while time.process_time() - t0 < 0.06:  # busy outside every range: not counted
        pass
    assert 0.03 <= clock.take_cpu() < 0.045
    assert clock.take_cpu() == 0.0
