"""Import a plan from what teams already have: a Megatron-LM launch script or command line, a
torchtitan TOML, or ParaScope's plan / report / review JSON.

    from parallel.importers import import_plan
    imported = import_plan("train_gpt3_175b_distributed.sh")      # or import_text(text, kind=...)
    imported.model, imported.plan, imported.world_size, imported.summary()

`python -m parallel plan --import FILE [cluster flags] [--json]` prints the plan report of the import.
Unknown flags are listed in `summary()["unknown"]`, never fatal; malformed input raises ImportFailed
naming the file and line. Pure: stdlib only.
"""

from __future__ import annotations

from pathlib import Path

from parallel.core.files import NotARegularFile, TooLarge, read_bounded
from parallel.core.specs import Cluster
from parallel.importers.base import Imported, ImportFailed
from parallel.importers.limits import MAX_INPUT_CHARS, input_error
from parallel.importers.megatron import import_megatron
from parallel.importers.plan_json import import_plan_json
from parallel.importers.shell_eval import Reader
from parallel.importers.torchtitan import import_torchtitan
from parallel.importers.torchtitan_registry import config_names, looks_like_registry

KINDS = ("megatron", "torchtitan", "plan-json")
# a file name's suffix -> the kind it holds; any other name (a .txt, a pasted command) is sniffed from the text
SUFFIXES = {
    **dict.fromkeys((".sh", ".bash", ".slurm", ".sbatch"), "megatron"),
    **dict.fromkeys((".toml", ".py"), "torchtitan"),
    ".json": "plan-json",
}
__all__ = [
    "KINDS",
    "SUFFIXES",
    "ImportFailed",
    "Imported",
    "config_names",
    "detect",
    "import_plan",
    "import_text",
    "place",
]


def detect(text: str, name: str = "") -> str:
    """megatron | torchtitan | plan-json, from the file name's suffix or else the text."""
    if kind := SUFFIXES.get(Path(name).suffix.lower()):
        return kind
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return "plan-json"
    if looks_like_registry(text):
        return "torchtitan"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if (
        lines
        and all(ln.startswith("[") or "=" in ln and " --" not in ln for ln in lines)
        and any(ln.startswith("[") for ln in lines)
    ):
        return "torchtitan"
    return "megatron"


def import_text(
    text: str, name: str = "pasted text", kind: str | None = None, read: Reader | None = None, config: str | None = None
) -> Imported:
    """Import `text` (`name` for messages). `read(name)`: the text of a file a launch script sources,
    or None (import_plan reads files beside the script; pasted text has none). `config`: which config
    of a torchtitan Python registry (None: its only one)."""
    kind = kind or detect(text, name)
    if kind not in KINDS:
        raise ImportFailed(f"unknown import kind {kind!r}; known: {', '.join(KINDS)}")
    if why := input_error(name, len(text)):
        raise ImportFailed(why)
    if not text.strip():
        raise ImportFailed(f"{name}: empty")
    try:
        if kind == "megatron":
            return import_megatron(text, name, read=read)
        if kind == "torchtitan":
            return import_torchtitan(text, name, config)
        return import_plan_json(text, name)
    except RecursionError:  # a bound the importers missed: still one line, never a traceback
        raise ImportFailed(f"{name}: nested too deeply to import") from None


def _read_text(path: Path) -> str:
    try:
        return read_bounded(path, MAX_INPUT_CHARS * 4).decode("utf-8")  # UTF-8: at most 4 bytes a character
    except NotARegularFile:
        raise ImportFailed(f"{path}: not a regular file") from None
    except TooLarge:
        raise ImportFailed(
            f"{path}: over {MAX_INPUT_CHARS * 4:,} bytes; an import is at most {MAX_INPUT_CHARS:,} characters"
        ) from None
    except OSError as err:
        raise ImportFailed(f"{path}: cannot read it ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise ImportFailed(f"{path}: not a text file") from None


def beside(folder: Path) -> Reader:
    """A reader of the files a script in `folder` sources: a relative name that stays inside `folder`
    (no `..` out of it, no absolute path), a regular file; anything else is None (named as unread)."""
    root = folder.resolve()

    def read(name: str) -> str | None:
        if not name or name.startswith(("/", "~")):
            return None
        target = (root / name).resolve()
        if not target.is_relative_to(root) or not target.is_file():
            return None
        try:
            return _read_text(target)
        except ImportFailed:
            return None

    return read


def import_plan(path: str | Path, kind: str | None = None, config: str | None = None) -> Imported:
    """Import the file at `path` (its kind from the suffix, else sniffed); a launch script's sourced
    config files are read when they sit beside it. `config`: a torchtitan registry's config to read."""
    path = Path(path)
    return import_text(_read_text(path), path.name, kind, read=beside(path.parent), config=config)


def place(imported: Imported, cluster: Cluster, nodes: int | None = None) -> tuple[Imported, Cluster]:
    """The import laid out on `cluster`: the world size from `nodes` when given (it overrides the
    file's), else the file's own; the cluster gets just enough nodes. ImportFailed if neither says."""
    gpn = cluster.gpus_per_node
    if nodes is not None:
        if nodes < 1:
            raise ImportFailed(f"--nodes must be at least 1, got {nodes}")
        why = f"{nodes} {'node' if nodes == 1 else 'nodes'} × {gpn} GPUs per node"  # the CLI's --nodes and the page's Nodes alike
        if imported.world_size and imported.world_size != nodes * gpn:
            why += f" (overrides the file's {imported.world_size} GPUs)"
        return imported.with_world_size(nodes * gpn, why), cluster.with_nodes(nodes)
    if imported.world_size is None:
        raise ImportFailed(
            f"{imported.source}: {imported.world_from}; give --nodes N (nodes of "
            f"{gpn} GPUs) to say how many GPUs the job runs on"
        )
    world = imported.world_size
    sized = (
        cluster.with_nodes(imported.nodes)
        if imported.nodes and imported.nodes * gpn == world
        else cluster.sized_for(world)
    )
    return imported, sized
