"""torchtitan's Python config registries, read without running them.

Since February 2026 torchtitan keeps its train configs as Python functions that return a
`Trainer.Config` (torchtitan/models/<model>/config_registry.py, picked with `--module <model>
--config <function>`), not as TOML. Running such a file needs torchtitan, and running a file someone
uploaded is not an option, so this module reads it as data: the syntax tree of one config function
is evaluated over a few shapes only -- literals, arithmetic on them, local names, calls to the
file's other functions (a config built from another and then edited: `config = llama3_8b();
config.parallelism.tensor_parallel_degree = 8`), attribute assignments, and every other call kept as
a record of its keyword arguments (`ParallelismConfig(tensor_parallel_degree=8)`). Anything else
(a loop, a helper that edits the config in place) is named in the notes and left out.

The result is the TOML torchtitan's older configs held (`registry_as_toml`), so one reading of
torchtitan's settings (parallel.importers.torchtitan) serves both:

* `model_registry("70B", moe_comm_backend=..., converters=[...])` -> [model] flavor, converters;
  [parallelism] expert_parallel_comm_backend. The model is the one the function's name names
  (llama3_70b, sft_qwen3_8b_math), as torchtitan's registries name them.
* `TrainingConfig(num_tokens_per_microbatch_per_dp_rank=N, max_context_length=S,
  num_tokens_per_train_step=T)` -> seq_len S, N / S sequences a microbatch, a global batch of T / S
  (-1: microbatch x pipeline microbatches x dp, as torchtitan defaults it).
* `ParallelismConfig(...)` -> [parallelism], its `num_pp_microbatches` the pipeline microbatches of a
  DP rank; `CompileConfig(enable_async_tensor_parallel=True)` -> async TP.
* `activation_checkpoint=FullAC.Config()` -> full; `SelectiveAC.Config()` (torchtitan's default) ->
  per-op selective; `MemoryBudgetAC` is not modelled (noted, read as none).

Pure: stdlib only (ast).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from typing import Any

from parallel.importers.limits import MAX_INPUT_CHARS

MAX_DEPTH = 8  # config functions calling config functions
MAX_NUMBER = 1 << 63  # past any degree or token count; a bigger value is left unevaluated (no runaway squaring)


class RegistryError(ValueError):
    """A registry the reader cannot use: `line` is where (None: the whole file)."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


@dataclass
class Record:
    """A call kept as data: what was called (`Trainer.Config`, `ParallelismConfig`) and its arguments."""

    kind: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    args: list[Any] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)  # keyword -> its line
    line: int | None = None

    @property
    def name(self) -> str:
        """The class or function called, without `.Config` (FullAC.Config -> FullAC)."""
        parts = self.kind.split(".")
        return parts[-2] if len(parts) > 1 and parts[-1] == "Config" else parts[-1]


class Unknown:
    """A value the reader does not evaluate (its source text kept for the notes)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"<{self.text}>"


def config_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """The file's train configs: public module-level functions of no required argument that return a
    Trainer.Config (or are annotated as some Config)."""
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        required = len(node.args.args) - len(node.args.defaults) + len(node.args.posonlyargs)
        returns = ast.unparse(node.returns) if node.returns else ""
        if required == 0 and returns.endswith("Config"):
            out[node.name] = node
    return out


def parse(text: str, source: str) -> ast.Module:
    try:
        return ast.parse(text, filename=source)
    except SyntaxError as err:
        raise RegistryError(f"not valid Python: {err.msg}", err.lineno) from None


@functools.lru_cache(maxsize=4)
def config_names(text: str) -> tuple[str, ...]:
    """The train configs of a registry's text, in file order (none when it is no valid Python or longer
    than an import may be). Kept for the last few texts: a page asks again on every rerun."""
    if len(text) > MAX_INPUT_CHARS:
        return ()
    try:
        return tuple(config_functions(ast.parse(text)))
    except (SyntaxError, ValueError, RecursionError):
        return ()


def looks_like_registry(text: str) -> bool:
    """True for Python that defines a function returning a Trainer.Config (a torchtitan registry)."""
    return "def " in text and "Trainer.Config" in text


class _Evaluator:
    def __init__(self, tree: ast.Module):
        self.functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        self.notes: list[str] = []
        self.depth = 0
        self.globals: dict[str, Any] = {}  # the module's own constants (SEQ_LEN = 8192)
        for node in tree.body:
            if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
                value = self.value(node.value, {})
                self.globals.update({t.id: value for t in node.targets})

    def call_function(self, node: ast.FunctionDef, args: list, kwargs: dict) -> Any:
        if self.depth >= MAX_DEPTH:
            raise RegistryError(f"{node.name}: config functions nested more than {MAX_DEPTH} deep", node.lineno)
        params = [a.arg for a in node.args.posonlyargs + node.args.args]
        defaults = node.args.defaults
        env: dict[str, Any] = {}
        for name, default in zip(params[len(params) - len(defaults) :], defaults):
            env[name] = self.value(default, {})
        env.update(zip(params, args))
        env.update({k: v for k, v in kwargs.items() if k in params})
        self.depth += 1
        try:
            return self.body(node, env)
        finally:
            self.depth -= 1

    def body(self, fn: ast.FunctionDef, env: dict) -> Any:
        for stmt in fn.body:
            if isinstance(stmt, ast.Return):
                return self.value(stmt.value, env) if stmt.value is not None else None
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                value = self.value(stmt.value, env)
                for target in targets:
                    self.assign(target, value, env, stmt.lineno)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            elif isinstance(stmt, (ast.Assert, ast.Pass, ast.Import, ast.ImportFrom)):
                continue
            else:
                self.notes.append(
                    f"line {stmt.lineno}: `{_short(stmt)}` in {fn.name} not read (not a plain assignment)"
                )
        return None

    def assign(self, target: ast.expr, value: Any, env: dict, line: int) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
            return
        if isinstance(target, ast.Attribute):
            owner = self.owner(target.value, env)
            if isinstance(owner, Record):
                owner.kwargs[target.attr] = value
                owner.lines[target.attr] = line
                return
        self.notes.append(f"line {line}: `{ast.unparse(target)} = ...` not read")

    def owner(self, node: ast.expr, env: dict) -> Any:
        """The record an attribute assignment edits; a section the config left at its default
        (`config.parallelism.x = ...` where no parallelism was given) is made empty on the way."""
        if isinstance(node, ast.Attribute):
            parent = self.owner(node.value, env)
            if isinstance(parent, Record):
                if node.attr not in parent.kwargs:
                    parent.kwargs[node.attr] = Record(node.attr, line=node.lineno)
                return parent.kwargs[node.attr]
        return self.value(node, env)

    def value(self, node: ast.expr, env: dict) -> Any:
        if isinstance(node, ast.Constant):
            return node.value if not _number(node.value) or abs(node.value) <= MAX_NUMBER else Unknown("a huge number")
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(e, env) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {self.value(k, env): self.value(v, env) for k, v in zip(node.keys, node.values) if k is not None}
        if isinstance(node, ast.Name):
            return env[node.id] if node.id in env else self.globals.get(node.id, Unknown(node.id))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = self.value(node.operand, env)
            return -v if _number(v) else Unknown(ast.unparse(node))
        if isinstance(node, ast.BinOp):
            return self.arithmetic(node, env)
        if isinstance(node, ast.Attribute):
            owner = self.value(node.value, env)
            if isinstance(owner, Record):
                return owner.kwargs.get(node.attr, Unknown(ast.unparse(node)))
            return Unknown(ast.unparse(node))
        if isinstance(node, ast.Call):
            return self.call(node, env)
        return Unknown(ast.unparse(node))

    def arithmetic(self, node: ast.BinOp, env: dict) -> Any:
        a, b = self.value(node.left, env), self.value(node.right, env)
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b, ast.FloorDiv: lambda: a // b}
        if _number(a) and _number(b) and type(node.op) in ops and not (isinstance(node.op, ast.FloorDiv) and b == 0):
            result = ops[type(node.op)]()
            if abs(result) <= MAX_NUMBER:  # operands this small keep every product cheap to compute
                return result
        return Unknown(ast.unparse(node))

    def call(self, node: ast.Call, env: dict) -> Any:
        called = ast.unparse(node.func)
        args = [self.value(a, env) for a in node.args if not isinstance(a, ast.Starred)]
        kwargs, lines = {}, {}
        for kw in node.keywords:
            if kw.arg is not None:
                kwargs[kw.arg], lines[kw.arg] = self.value(kw.value, env), kw.value.lineno
        if isinstance(node.func, ast.Name) and node.func.id in self.functions:
            return self.call_function(self.functions[node.func.id], args, kwargs)
        return Record(called, kwargs, args, lines, node.lineno)


def describe(value: Any) -> str:
    """A value as the notes name it: a call by what it calls, an unevaluated expression by its text."""
    if isinstance(value, Record):
        return f"{value.kind}(...)"
    return value.text if isinstance(value, Unknown) else repr(value)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _short(stmt: ast.stmt) -> str:
    text = ast.unparse(stmt).splitlines()[0]
    return text if len(text) <= 60 else text[:57] + "..."


def read_config(text: str, source: str, name: str | None) -> tuple[str, Record, list[str], int]:
    """(the config's name, the Trainer.Config record it returns, notes, its def's line). `name`: the
    function to read; None picks the file's only one, or fails naming them all."""
    tree = parse(text, source)
    configs = config_functions(tree)
    if not configs:
        raise RegistryError("no torchtitan config in it: no function returns a Trainer.Config")
    if name is None:
        if len(configs) > 1:
            raise RegistryError(f"{len(configs)} torchtitan configs in it; name one of: {', '.join(configs)}")
        name = next(iter(configs))
    if name not in configs:
        raise RegistryError(f"no torchtitan config {name!r} in it; its configs: {', '.join(configs)}")
    ev = _Evaluator(tree)
    result = ev.call_function(configs[name], [], {})
    if result is None:
        raise RegistryError(
            f"{name} returns nothing the reader follows: no `return` at the top level of its body",
            configs[name].lineno,
        )
    if not isinstance(result, Record) or not ("model_spec" in result.kwargs or result.name.endswith("Trainer")):
        raise RegistryError(
            f"{name} returns {describe(result)}, not a Trainer.Config built in this file (the reader follows "
            "the file's own functions, not ones it imports)",
            configs[name].lineno,
        )
    return name, result, ev.notes, configs[name].lineno


# ---------------------------------------------------------------- as torchtitan's TOML


MOE_BACKENDS = ("standard", "deepep", "hybridep")  # torchtitan's moe_comm_backend values the plan models
AC_MODES = {"FullAC": "full", "SelectiveAC": "selective", "NoAC": "none"}


def registry_as_toml(
    text: str, source: str, name: str | None, model_names: tuple[str, ...]
) -> tuple[str, dict, dict[tuple[str, str | None], int], list[str]]:
    """(the config's name, its settings as torchtitan's TOML sections, (section, key) -> the line
    that set it, notes). `model_names`: torchtitan model names the caller knows, matched as the config
    function's prefix (longest first)."""
    name, cfg, notes, def_line = read_config(text, source, name)
    lines: dict[tuple[str, str | None], int] = {("parallelism", None): def_line, ("model", None): def_line}
    data: dict[str, dict] = {"model": {}, "training": {}, "parallelism": {}, "activation_checkpoint": {}}

    def put(section: str, key: str, value: Any, line: int | None) -> None:
        if isinstance(value, (Unknown, Record)):  # a call's result is no setting the reader can know
            notes.append(
                f"line {line}: {key} = {describe(value)} is not a value the reader evaluates; left at its default"
            )
            return
        data[section][key] = value
        lines[(section, key)] = line or def_line

    words = name.split("_")  # the model is named in the function's name: llama3_70b, sft_qwen3_8b_math
    model = next(
        (
            m
            for m in sorted(model_names, key=len, reverse=True)
            for i in range(len(words))
            if words[i : i + m.count("_") + 1] == m.split("_")
        ),
        None,
    )
    if model is None:
        raise RegistryError(
            f"{name}: the model is read from the config's name, and it names none of the torchtitan models "
            f"the planner knows ({', '.join(model_names)})",
            def_line,
        )
    put("model", "name", model, def_line)
    spec = cfg.kwargs.get("model_spec")
    if not isinstance(spec, Record) or spec.name != "model_registry" or not spec.args:
        got = "not set" if spec is None else f"{describe(spec)}, not a model_registry(flavor, ...) call"
        raise RegistryError(
            f"{name}: model_spec is {got}; the reader takes the model's flavour from model_registry(flavor, ...)",
            cfg.lines.get("model_spec") or def_line,
        )
    put("model", "flavor", spec.args[0], spec.line)
    given = spec.kwargs.get("converters")
    converters = [c.name for c in given if isinstance(c, Record)] if isinstance(given, list) else []
    if given is not None and not isinstance(given, list):
        notes.append(f"line {spec.lines.get('converters')}: converters built by a call; not read (no float8/MX)")
    if converters:
        put("model", "converters", converters, spec.lines.get("converters"))
    backend = spec.kwargs.get("moe_comm_backend", "standard")
    if backend in MOE_BACKENDS:
        put("parallelism", "expert_parallel_comm_backend", backend, spec.lines.get("moe_comm_backend"))
    else:
        notes.append(
            f"line {spec.lines.get('moe_comm_backend')}: moe_comm_backend {describe(backend)} not modelled; read as standard"
        )
    if (attn := spec.kwargs.get("attn_backend")) is not None:
        notes.append(f"attn_backend {describe(attn)}: priced as SDPA's flash kernel")

    par = cfg.kwargs.get("parallelism")
    if isinstance(par, Record):
        for key, value in par.kwargs.items():
            if key != "num_pp_microbatches":
                put("parallelism", key, value, par.lines.get(key))
    train = cfg.kwargs.get("training")
    train_kw = train.kwargs if isinstance(train, Record) else {}
    train_lines = train.lines if isinstance(train, Record) else {}
    seq = train_kw.get("max_context_length", 2048)
    tokens = train_kw.get("num_tokens_per_microbatch_per_dp_rank", 16384)
    step_tokens = train_kw.get("num_tokens_per_train_step", -1)
    if not all(_number(v) for v in (seq, tokens, step_tokens)) or seq <= 0 or tokens <= 0:
        raise RegistryError(
            f"{name}: the training tokens and context length must be positive numbers "
            f"(num_tokens_per_microbatch_per_dp_rank {tokens!r}, max_context_length {seq!r})",
            train_lines.get("num_tokens_per_microbatch_per_dp_rank") or def_line,
        )
    if tokens % seq or (step_tokens > 0 and step_tokens % seq):
        raise RegistryError(
            f"{name}: {tokens:,} tokens a microbatch (or {step_tokens:,} a step) is not a whole number of "
            f"{seq:,}-token sequences",
            train_lines.get("num_tokens_per_microbatch_per_dp_rank") or def_line,
        )
    mb = tokens // seq
    pp = data["parallelism"].get("pipeline_parallel_degree", 1)
    pp_micro = par.kwargs.get("num_pp_microbatches", 1) if isinstance(par, Record) else 1
    if not _number(pp_micro) or pp_micro < 1:
        raise RegistryError(
            f"{name}: num_pp_microbatches must be a positive integer", par.lines.get("num_pp_microbatches")
        )
    put("training", "seq_len", seq, train_lines.get("max_context_length"))
    put(
        "training",
        "local_batch_size",
        mb * (pp_micro if pp != 1 else 1),
        train_lines.get("num_tokens_per_microbatch_per_dp_rank"),
    )
    if pp != 1:
        put(
            "parallelism",
            "pipeline_parallel_microbatch_size",
            mb,
            train_lines.get("num_tokens_per_microbatch_per_dp_rank"),
        )
    if step_tokens > 0:
        put("training", "global_batch_size", step_tokens // seq, train_lines.get("num_tokens_per_train_step"))
    notes.append(
        f"{name}: {tokens:,} tokens a microbatch of {seq:,}-token sequences = micro batch {mb}"
        + (f", {pp_micro} pipeline microbatches a DP rank" if pp != 1 else "")
        + (f"; {step_tokens:,} tokens a step = global batch {step_tokens // seq}" if step_tokens > 0 else "")
    )
    for key in ("mixed_precision_param", "mixed_precision_reduce", "enable_cpu_offload"):
        if key in train_kw:
            put("training", key, train_kw[key], train_lines.get(key))

    compile_cfg = cfg.kwargs.get("compile")
    if isinstance(compile_cfg, Record) and compile_cfg.kwargs.get("enable_async_tensor_parallel") is True:
        put("parallelism", "enable_async_tensor_parallel", True, compile_cfg.lines.get("enable_async_tensor_parallel"))
    ac = cfg.kwargs.get("activation_checkpoint", Record("SelectiveAC.Config"))
    ac_name = ac.name if isinstance(ac, Record) else ""
    mode = AC_MODES.get(ac_name)
    if mode is None:
        notes.append(f"activation_checkpoint {ac_name or describe(ac)} not modelled; read as no checkpointing")
        mode = "none"
    put("activation_checkpoint", "mode", mode, cfg.lines.get("activation_checkpoint"))
    if mode == "selective":  # torchtitan's SelectiveAC is per-op: every other matmul recomputed
        put("activation_checkpoint", "selective_ac_option", "op", cfg.lines.get("activation_checkpoint"))
    return name, data, lines, notes
