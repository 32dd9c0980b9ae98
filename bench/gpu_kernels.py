"""Bench: the device model's kernel efficiencies against kernels timed on the GPU at hand.

    python -m bench.gpu_kernels [--out gpu_kernels.json] [--device h200-sxm]   # on a CUDA machine
    python -m bench.gpu_kernels --measured gpu_kernels.json [--device h200-sxm]  # re-print, no GPU needed

Times, with CUDA events, what `parallel.core.compute` models: bf16 GEMMs on a grid of shapes and at
the shapes of each preset model's layers (the forward GEMMs of one TP rank at TP 1-8 and their two
backward products), fp8 GEMMs (`torch._scaled_mm`), causal flash attention forward and forward +
backward (PyTorch SDPA's flash and cuDNN back ends), element-wise kernels' bandwidth, and whole
transformer layers (plain PyTorch: norms, fused-QKV GEMMs, SDPA, GeLU or SwiGLU) forward + backward.
Each is printed beside the model's time for the same shape on `--device`, as measured/modelled
efficiency, with mean and worst ratios per kind. The measurements go to `--out` as JSON, so the
comparison can be re-printed against a changed model on any machine.

On a machine without CUDA (or without torch) it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from parallel.core import compute
from parallel.core.devices import DEVICES, Device
from parallel.core.memory import ActivationOptions
from parallel.core.plan import Plan
from parallel.core.specs import MODELS, Model

GRID_M = (1024, 2048, 4096, 8192, 16384)
GRID_N = (512, 1024, 2048, 4096, 8192, 16384)
GRID_K = (256, 512, 1024, 2048, 4096, 8192, 16384)
MAX_FLOPS = 6e12
LAUNCH_BOUND_S = 30e-6  # kernels shorter than this time Python's launch loop, not the GPU  # skip grid points above this (each would take > 8 ms)
PRESETS = ("gpt3-22b", "gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "qwen3-32b")
ATTN_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
LAYERS = (  # (label, model preset or shape, tp, tokens): one TP rank's layer, no communication
    ("gpt 1.7B-like, s 4096", dict(layers=24, hidden=2048, heads=16, vocab=131072, seq_len=4096), 1, 4096),
    ("llama3-8b, s 8192", "llama3-8b", 1, 8192),
    ("llama3-70b tp8, s 8192", "llama3-70b", 8, 8192),
    ("gpt3-175b tp8, s 2048", "gpt3-175b", 8, 2048),
)


def layer_shapes() -> list[tuple[int, int, int]]:
    """The distinct (m, n, k) of every preset's forward, dgrad and wgrad GEMMs at TP 1, 2, 4, 8."""
    shapes = set()
    for name in PRESETS:
        model = MODELS[name]
        for tp in (1, 2, 4, 8):
            plan = Plan(tp=tp, sp=tp > 1, global_batch=1)
            if model.heads % tp or model.ffn_hidden % tp:
                continue
            dense, moe = compute.layer_gemms(model, plan)
            for g in dense + moe:
                m, n, k = (int(round(float(x))) for x in (g.m, g.n, g.k))
                shapes |= {(m, n, k), (m, k, n), (k, n, m)}
    return sorted(shapes)


# ----------------------------------------------------------------------------- measuring (CUDA)


def _timer(torch):
    def run(fn, *, min_ms: float = 10.0, reps: int = 7) -> float:
        """Median seconds of `fn` over `reps` timed batches, each long enough to time."""
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        one = max(start.elapsed_time(end), 1e-3)
        inner = max(1, int(min_ms / one))
        times = []
        for _ in range(reps):
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / inner / 1e3)
        return statistics.median(times)

    return run


def measure_gemms(torch, shapes, *, fp8: bool = False) -> list[dict]:
    run = _timer(torch)
    out = []
    for m, n, k in shapes:
        if 2.0 * m * n * k > MAX_FLOPS:
            continue
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        try:
            if fp8:
                a8 = a.to(torch.float8_e4m3fn)
                b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
                one = torch.ones((), device="cuda")
                seconds = run(
                    lambda a8=a8, b8=b8, one=one: torch._scaled_mm(
                        a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16
                    )
                )
            else:
                seconds = run(lambda a=a, b=b: a @ b)
        except (RuntimeError, TypeError) as err:  # a shape the fp8 kernel refuses (multiples of 16)
            out.append({"m": m, "n": n, "k": k, "error": str(err)[:200]})
            continue
        out.append({"m": m, "n": n, "k": k, "seconds": seconds})
    return out


def measure_attention(torch) -> list[dict]:
    # lazy: torch (2 s) only when measuring on a GPU; the offline comparison (--measured) runs without it
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    run = _timer(torch)
    out = []
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    for d, heads in ((128, 32), (64, 32)):
        for s in ATTN_LENGTHS if d == 128 else (2048, 8192):
            b = max(1, 16384 // s)
            q, k, v = (
                torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
            )
            grad = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16)
            for name, backend in backends.items():
                try:
                    with sdpa_kernel(backend):
                        fwd = run(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps=5)
                        both = run(
                            lambda q=q, k=k, v=v, grad=grad: F.scaled_dot_product_attention(
                                q, k, v, is_causal=True
                            ).backward(grad),
                            reps=5,
                        )
                except RuntimeError as err:
                    out.append({"backend": name, "s": s, "d": d, "error": str(err)[:200]})
                    continue
                out.append({"backend": name, "b": b, "heads": heads, "s": s, "d": d, "fwd_s": fwd, "fwd_bwd_s": both})
    return out


def measure_elementwise(torch) -> list[dict]:
    import torch.nn.functional as F  # lazy: torch, only when measuring on a GPU (see measure)

    run = _timer(torch)
    n = 1 << 27  # 128 Mi bf16 elements, 256 MiB a tensor: far past the L2
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    z = torch.empty_like(x)
    rows = x.view(-1, 4096)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    cases = {  # name: (fn, bytes moved)
        "copy": (lambda: z.copy_(x), 4 * n),
        "add": (lambda: torch.add(x, y, out=z), 6 * n),
        "gelu": (lambda: F.gelu(x), 4 * n),
        "layer_norm": (lambda: F.layer_norm(rows, (4096,), w), 4 * n),
        "silu_mul": (lambda: F.silu(x) * y, 10 * n),  # two kernels: silu writes, mul reads it back
        "softmax": (lambda: torch.softmax(rows, dim=-1), 4 * n),
    }
    return [{"op": k, "bytes": b, "seconds": run(fn, reps=5)} for k, (fn, b) in cases.items()]


def _layer_module(torch, model: Model, tp: int, device: str = "cuda"):
    import torch.nn.functional as F  # lazy: torch, only when measuring on a GPU (see measure)

    h, d = model.hidden, model.head_dim
    heads, kv = model.heads // tp, max(model.kv_heads // tp, 1)
    f = model.ffn_hidden // tp
    gated = model.gated_mlp
    dev, dt = device, torch.bfloat16
    p = {
        "qkv": torch.randn(h, (heads + 2 * kv) * d, device=dev, dtype=dt) * 0.02,
        "proj": torch.randn(heads * d, h, device=dev, dtype=dt) * 0.02,
        "fc1": torch.randn(h, (2 if gated else 1) * f, device=dev, dtype=dt) * 0.02,
        "fc2": torch.randn(f, h, device=dev, dtype=dt) * 0.02,
    }
    for t in p.values():
        t.requires_grad_(True)

    def layer(x):  # x: [T, h], one sequence
        T = x.shape[0]
        y = F.layer_norm(x, (h,))
        qkv = y @ p["qkv"]
        q, k, v = qkv.split([heads * d, kv * d, kv * d], dim=-1)
        q = q.view(1, T, heads, d).transpose(1, 2)
        k = k.view(1, T, kv, d).transpose(1, 2).repeat_interleave(heads // kv, dim=1)
        v = v.view(1, T, kv, d).transpose(1, 2).repeat_interleave(heads // kv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(T, heads * d)
        x = x + a @ p["proj"]
        y = F.layer_norm(x, (h,))
        u = y @ p["fc1"]
        u = F.silu(u[:, :f]) * u[:, f:] if gated else F.gelu(u)
        return x + u @ p["fc2"]

    return layer


def measure_layers(torch) -> list[dict]:
    run = _timer(torch)
    out = []
    for label, spec, tp, tokens in LAYERS:
        model = MODELS[spec] if isinstance(spec, str) else Model(name=label, **spec)
        layer = _layer_module(torch, model, tp)
        x = torch.randn(tokens, model.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        fwd = run(lambda layer=layer, x=x: layer(x), reps=5)
        both = run(lambda layer=layer, x=x: layer(x).sum().backward(), reps=5)
        out.append({"label": label, "tp": tp, "tokens": tokens, "fwd_s": fwd, "fwd_bwd_s": both})
    return out


def measure(out_path: Path) -> dict | None:
    try:
        import torch  # lazy: 2 s, only when measuring on a GPU; the offline comparison (--measured) runs without it
    except ImportError:
        print("bench.gpu_kernels: torch is not installed; nothing to measure (re-print with --measured FILE)")
        return None
    if not torch.cuda.is_available():
        print("bench.gpu_kernels: no CUDA device here; nothing to measure (re-print with --measured FILE)")
        return None
    props = torch.cuda.get_device_properties(0)
    data: dict = {
        "device": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    grid = [(m, n, k) for m in GRID_M for n in GRID_N for k in GRID_K]
    sections = (
        ("gemm_grid", lambda: measure_gemms(torch, grid)),
        ("gemm_layers", lambda: measure_gemms(torch, layer_shapes())),
        ("attention", lambda: measure_attention(torch)),
        ("elementwise", lambda: measure_elementwise(torch)),
        ("layers", lambda: measure_layers(torch)),
        ("fp8_grid", lambda: measure_gemms(torch, [s for s in grid if s[2] >= 512], fp8=True)),
    )
    for name, fn in sections:
        t0 = time.perf_counter()
        try:
            data[name] = fn()
        except Exception as err:  # keep what the other sections measured
            data[name] = {"error": f"{type(err).__name__}: {err}"[:300]}
        data.setdefault("section_seconds", {})[name] = round(time.perf_counter() - t0, 1)
        torch.cuda.empty_cache()
        tmp = out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(out_path)
        print(f"{name}: {data['section_seconds'][name]} s", flush=True)
    return data


# ----------------------------------------------------------------------------- comparing (no GPU)


def _ratio_line(kind: str, ratios: list[float]) -> str:
    if not ratios:
        return f"{kind:<24} no points"
    logs = [abs(math.log(r)) for r in ratios]
    worst = max(ratios, key=lambda r: abs(math.log(r)))
    return (
        f"{kind:<24} {len(ratios):>4} points  measured/modelled: median {statistics.median(ratios):.2f}, "
        f"mean |log| {statistics.fmean(logs):.2f} ({math.exp(statistics.fmean(logs)) - 1:.0%}), worst {worst:.2f}"
    )


def compare(data: dict, dev: Device, *, verbose: bool = False) -> list[str]:
    lines = [f"measured on {data.get('device')} ({data.get('sms')} SMs, torch {data.get('torch')}); model: {dev.name}"]
    for section, fp8 in (("gemm_grid", False), ("gemm_layers", False), ("fp8_grid", True)):
        rows = data.get(section)
        if not isinstance(rows, list):
            lines.append(f"{section}: {rows}")
            continue
        ratios, table, short = [], [], 0
        for r in rows:
            if "seconds" not in r:
                continue
            if r["seconds"] < LAUNCH_BOUND_S:  # the host's launch rate, not the kernel, sets these
                short += 1
                continue
            m, n, k = r["m"], r["n"], r["k"]
            flops = 2.0 * m * n * k
            measured = flops / r["seconds"] / dev.peak(fp8)
            modelled = flops / float(compute.gemm_seconds(dev, m, n, k, fp8)) / dev.peak(fp8)
            ratios.append(measured / modelled)
            table.append((m, n, k, measured, modelled))
        lines.append(_ratio_line(section, ratios) + f" ({short} shorter than {LAUNCH_BOUND_S * 1e6:.0f} us left out)")
        if verbose:
            lines += [f"  {m:>6} x {n:>6} x {k:>6}: measured {a:.2f}, modelled {b:.2f}" for m, n, k, a, b in table]
    att = data.get("attention")
    if isinstance(att, list):
        for backend in ("flash", "cudnn"):
            ratios = []
            for r in att:
                if r.get("backend") != backend or "fwd_bwd_s" not in r:
                    continue
                model = Model(
                    name="attn", layers=1, hidden=r["heads"] * r["d"], heads=r["heads"], vocab=128, seq_len=r["s"]
                )
                plan = Plan(micro_batch=r["b"], global_batch=r["b"], attention="fa2" if backend == "flash" else "fused")
                t = compute.attention_core_seconds_per_layer(dev, model, plan, ActivationOptions())
                ratios.append(float(t["fwd"] + t["bwd"]) / r["fwd_bwd_s"])
                if verbose:
                    flops = 3 * 0.5 * 4 * r["b"] * r["heads"] * r["d"] * r["s"] ** 2
                    lines.append(
                        f"  {backend} s {r['s']:>6} d {r['d']}: fwd+bwd {flops / r['fwd_bwd_s'] / 1e12:.0f} TFLOP/s "
                        f"({flops / r['fwd_bwd_s'] / dev.bf16_flops:.2f} of peak), modelled "
                        f"{flops / float(t['fwd'] + t['bwd']) / dev.bf16_flops:.2f}"
                    )
            lines.append(_ratio_line(f"attention ({backend})", ratios))
    ew = data.get("elementwise")
    if isinstance(ew, list):
        bw = dev.hbm_bytes_per_s * dev.memory_efficiency
        parts = [f"{r['op']} {r['bytes'] / r['seconds'] / 1e12:.2f}" for r in ew if "seconds" in r]
        lines.append(f"element-wise TB/s: {', '.join(parts)}; modelled {bw / 1e12:.2f}")
    layers = data.get("layers")
    if isinstance(layers, list):
        ratios = []
        for r in layers:
            spec = next(s for lab, s, *_ in LAYERS if lab == r["label"])
            model = MODELS[spec] if isinstance(spec, str) else Model(name=r["label"], **spec)
            model = Model(**{**model.to_dict(), "seq_len": r["tokens"], "dropout": False})
            plan = Plan(tp=r["tp"], global_batch=1)
            # one layer alone on one GPU: the kernels' isolated speed (no in-job derating)
            cost = compute.layer_cost(model, plan, dev, ActivationOptions(), job_efficiency=1.0)
            modelled = float(cost.layer)
            ratios.append(modelled / r["fwd_bwd_s"])
            lines.append(
                f"  layer {r['label']}: measured {r['fwd_bwd_s'] * 1e3:.2f} ms fwd+bwd, modelled {modelled * 1e3:.2f} ms"
            )
        lines.append(_ratio_line("layers (modelled/measured)", ratios))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gpu_kernels.json"))
    ap.add_argument("--measured", type=Path, default=None, help="re-print a saved measurement")
    ap.add_argument("--device", default="h200-sxm", choices=sorted(DEVICES), help="the device model to compare with")
    ap.add_argument("--verbose", action="store_true", help="every shape")
    args = ap.parse_args(argv)
    if args.measured:
        data = json.loads(args.measured.read_text())
    else:
        data = measure(args.out)
        if data is None:
            return 0
    print("\n".join(compare(data, DEVICES[args.device], verbose=args.verbose)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
