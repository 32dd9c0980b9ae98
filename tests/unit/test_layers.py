"""The folder says the layer: every import of every shipped module (top-level and inside functions) is
read from its syntax tree and checked against one rule per folder -- which project folders it may
import (only those of a lower rank: no upward import) and which libraries it may not (pure folders
never import torch, streamlit or sqlalchemy) -- and the module graph has no cycle. Imports sit at
module top: one inside a function carries a `# lazy: <reason>` comment."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("runfiles", "parallel", "profiler", "ui", "pages", "parascope")
PURE_BANS = ("torch", "streamlit", "sqlalchemy", "altair")
NO_TORCH_NO_UI = PURE_BANS  # not pure (it runs or reads jobs), but loads neither torch nor a UI library


@dataclass(frozen=True)
class Rule:
    rank: int  # a module may import project modules of a strictly lower rank, or of its own folder
    banned: tuple[str, ...] = ()  # top-level libraries it may not import
    pure: bool = False


# One rule per folder (the longest matching prefix wins). Ranks run bottom-up.
RULES = {
    "parallel.core": Rule(0, PURE_BANS, pure=True),  # the plan model
    "runfiles": Rule(0, PURE_BANS, pure=True),  # what engine and profiler share: run directory, ps.comm names
    "parallel.search": Rule(1, PURE_BANS, pure=True),
    "parallel.importers": Rule(1, PURE_BANS, pure=True),
    "parallel.review": Rule(1, PURE_BANS, pure=True),
    "parallel.review.store": Rule(1, ("torch", "streamlit", "altair")),  # the one SQLAlchemy user
    "profiler.traces": Rule(1, PURE_BANS, pure=True),
    "profiler.analyzers": Rule(2, PURE_BANS, pure=True),
    "parallel.engine": Rule(3, ("streamlit", "altair", "sqlalchemy")),  # torch
    "parallel.cli": Rule(4, ("streamlit", "altair")),
    "profiler.collect": Rule(5, ("streamlit", "altair", "sqlalchemy")),
    # what the dashboard reads of collected sets loads no torch either: trace sets, uploads, their calibration
    "profiler.collect.trace_sets": Rule(5, NO_TORCH_NO_UI),
    "profiler.collect.uploads": Rule(5, NO_TORCH_NO_UI),
    "profiler.collect.runs_calibration": Rule(5, NO_TORCH_NO_UI),
    "profiler.lab": Rule(5, ("streamlit", "altair", "sqlalchemy")),
    "profiler.commbench": Rule(6, ("streamlit", "altair", "sqlalchemy")),
    "profiler.cli": Rule(7, ("streamlit", "altair", "sqlalchemy")),
    "parallel": Rule(8, ("streamlit", "altair")),  # the packages' fronts: __init__, __main__
    "profiler": Rule(8, ("streamlit", "altair")),
    "parascope": Rule(8, ("streamlit", "altair")),
    "ui": Rule(9, ("torch",)),
    "pages": Rule(10, ("torch",)),
    "app": Rule(11, ("torch",)),
}


def rule_of(module: str) -> tuple[str, Rule]:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in RULES:
            return key, RULES[key]
    raise AssertionError(f"{module}: no layer rule covers it; add its folder to RULES")


def package_of(module: str) -> str:
    path = MODULES[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def module_files() -> dict[str, Path]:
    out = {"app": ROOT / "app.py"}
    for top in SHIPPED:
        for path in (ROOT / top).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


MODULES = module_files()


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported name) for every import in the file; `from X import Y` names X.Y when that is a module."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:
                full = f"{mod}.{a.name}"
                out.append((node.lineno, full if full in MODULES else mod))
    return out


def project_target(name: str) -> str | None:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in MODULES:
            return ".".join(parts[:n])
    return None


GRAPH = {m: imports_of(m, p) for m, p in MODULES.items()}


def test_every_shipped_module_has_a_rule():
    assert len(MODULES) > 100
    for m in MODULES:
        rule_of(m)


def test_no_upward_import_and_no_banned_library():
    problems = []
    for module, edges in GRAPH.items():
        folder, rule = rule_of(module)
        for line, name in edges:
            top = name.split(".")[0]
            if top in rule.banned:
                problems.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {folder} may not import {name}")
            target = project_target(name)
            if target is None or target == module:
                continue
            t_folder, t_rule = rule_of(target)
            same_folder = t_folder == folder or package_of(target) == package_of(module)
            if not same_folder and t_rule.rank >= rule.rank:
                problems.append(
                    f"{MODULES[module].relative_to(ROOT)}:{line}: {folder} (rank {rule.rank}) imports "
                    f"{target} of {t_folder} (rank {t_rule.rank})"
                )
    assert not problems, "\n".join(problems)


def test_pure_folders_import_no_torch_streamlit_or_sqlalchemy():
    pure = [m for m in MODULES if rule_of(m)[1].pure]
    assert any(m.startswith("parallel.core.") for m in pure) and any(m.startswith("profiler.analyzers.") for m in pure)
    for m in pure:
        for _, name in GRAPH[m]:
            assert name.split(".")[0] not in ("torch", "streamlit", "sqlalchemy"), (m, name)


def test_no_import_cycle():
    """Tarjan's strongly connected components over module -> module edges: none may hold two modules."""
    edges = {m: sorted({t for _, n in GRAPH[m] if (t := project_target(n)) and t != m}) for m in MODULES}
    index, low, stack, on, cycles = {}, {}, [], set(), []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("bad, good", [("profiler.cli.run", "runfiles.rundir"), ("ui.loaders", "parallel.core.memory")])
def test_the_rule_itself_catches_an_upward_import(bad, good):
    """The checker is not vacuous: an import from a lower layer to a higher one is flagged by rank."""
    assert rule_of(bad)[1].rank > rule_of(good)[1].rank


def _unannotated(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    missing = [
        x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.annotation is None and x.arg not in ("self", "cls")
    ]
    missing += [f"*{x.arg}" for x in (a.vararg, a.kwarg) if x is not None and x.annotation is None]
    if fn.returns is None and fn.name != "__init__":
        missing.append("return")
    return missing


def test_public_functions_of_pure_folders_are_typed():
    """Every public function and public method of a public class in a pure folder annotates each
    argument and its return."""
    problems = []
    for module, path in MODULES.items():
        if not rule_of(module)[1].pure:
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            fns = [(node, "")] if isinstance(node, ast.FunctionDef) else []
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                fns = [(f, f"{node.name}.") for f in node.body if isinstance(f, ast.FunctionDef)]
            for fn, owner in fns:
                if fn.name.startswith("_") and fn.name != "__init__":
                    continue
                if missing := _unannotated(fn):
                    problems.append(f"{path.relative_to(ROOT)}:{fn.lineno} {owner}{fn.name}: {', '.join(missing)}")
    assert not problems, "\n".join(problems)


def test_parallel_imports_nothing_from_profiler():
    """The engine and the plan model stand below the profiler: what both read and write is runfiles'."""
    bad = [
        f"{MODULES[m].relative_to(ROOT)}:{line}: {name}"
        for m in MODULES
        if m.startswith("parallel")
        for line, name in GRAPH[m]
        if name.split(".")[0] == "profiler"
    ]
    assert not bad, "\n".join(bad)


# ui/ modules that use neither Streamlit nor Altair: the dashboard's state and plumbing, no analysis
# (what a page computes about a trace set or a plan lives in profiler.analyzers or parallel.core)
UI_PLUMBING = {
    "ui": "the package",
    "ui.text": "Markdown escaping",
    "ui.demo": "starting the demo run",
    "ui.run_tables": "the analyzers' frames as the run pages' table headers and chart marks (ms, labels)",
    "ui.whatif_tables": "the what-if's and critical path's results as the timeline's tables and marks",
}


def test_ui_modules_without_streamlit_or_altair_are_plumbing_only():
    def uses_ui_library(m):
        return any(name.split(".")[0] in ("streamlit", "altair") for _, name in GRAPH[m])

    pure_ui = {m for m in MODULES if m == "ui" or m.startswith("ui.")} - {m for m in MODULES if uses_ui_library(m)}
    assert pure_ui <= set(UI_PLUMBING), (
        f"analysis belongs in profiler.analyzers or parallel.core: {pure_ui - set(UI_PLUMBING)}"
    )


LAZY = "# lazy:"  # a reason must follow: what the import costs or needs, and who must not pay it


def _lazy_reason(lines: list[str], node: ast.stmt) -> str:
    """The `# lazy:` reason of an import inside a function: on its own line, or on the comment line just
    above the block of consecutive imports it belongs to; '' when there is none."""
    k = node.lineno - 2
    while k >= 0 and lines[k].strip().startswith(("import ", "from ")):
        k -= 1
    for line in (lines[node.lineno - 1], lines[k] if k >= 0 else ""):
        if LAZY in line and (reason := line.split(LAZY, 1)[1].strip()):
            return reason
    return ""


def imports_inside_functions(path: Path) -> list[tuple[int, str]]:
    """(line, reason) of every import statement inside a function of the file."""
    text = path.read_text()
    lines, out = text.splitlines(), []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child.lineno, _lazy_reason(lines, child)))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(text, str(path)), False)
    return out


def test_imports_inside_functions_say_why():
    """Imports sit at module top; one inside a function says why on its line or just above its block
    (`# lazy: torch is 2 s and only a rank needs it`): the shipped packages, the benches, scripts and tests."""
    files = list(MODULES.values())
    files += [p for top in ("bench", "scripts", "tests") for p in (ROOT / top).rglob("*.py")]
    problems = [
        f"{path.relative_to(ROOT)}:{line}: an import inside a function without a '{LAZY} <reason>' comment"
        for path in files
        for line, reason in imports_inside_functions(path)
        if not reason
    ]
    assert not problems, "\n".join(problems)


def test_the_lazy_rule_itself_flags_an_unexplained_import(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "def a():\n    import json\n\n\n"  # no reason: flagged
        "def b():\n    # lazy: torch is 2 s and only b needs it\n    import os\n    import sys\n\n\n"  # a block's reason
        "def c():\n    import re  # lazy:\n\n\n"  # an empty reason: flagged
        "def d():\n    import csv  # lazy: the optional extra\n"
    )
    assert [line for line, reason in imports_inside_functions(path) if not reason] == [2, 12]
    assert len(imports_inside_functions(path)) == 5
