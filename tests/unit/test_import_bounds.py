"""Imports are bounded by the mechanism (parallel/importers/limits.py), not by cases:
hostile scripts, TOMLs and JSON of every family -- integer blow-ups, doubling strings and arrays,
self-calling eval, deep nesting of each construct, huge inputs, deep or wide TOML -- end in one
ImportFailed naming the line, fast and in little memory; a hypothesis fuzz over shell and TOML
fragments allows nothing but a plan or ImportFailed."""

from __future__ import annotations

import resource
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel.importers import ImportFailed, import_plan, import_text
from parallel.importers import limits as L

LAUNCH = "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128\n"


def doubling(prefix: str, step: str, times: int) -> str:
    return prefix + step * times + LAUNCH


# (name, text, file suffix, what the message says). Sizes are chosen beside the reported ones, not equal to them.
HOSTILE = [
    ("power tower", "TP=$((7**7**7))\n" + LAUNCH, ".sh", "exceeds 64-bit"),
    ("huge power", "TP=$((3**(2**33)))\n" + LAUNCH, ".sh", "exceeds 64-bit"),
    ("product overflow", "A=$((4294967296*4294967296*8))\n" + LAUNCH, ".sh", "exceeds 64-bit"),
    ("string doubling", doubling("A=abcdefgh\n", 'A="$A$A$A"\n', 25), ".sh", "characters"),
    ("array doubling", doubling("A=(a b)\n", 'A=("${A[@]}" "${A[@]}" "${A[@]}")\n', 25), ".sh", "words"),
    ("self eval", 'E=\'eval "$E"\'\neval "$E"\n', ".sh", "nested deeper"),
    ("sh -c loop", 'C=\'bash -c "$C"\'\nbash -c "$C"\n', ".sh", "nested deeper"),
    ("deep if", "if [ 1 = 1 ]; then\n" * 700 + "X=1\n" + "fi\n" * 700, ".sh", "nested deeper"),
    ("deep braces", "{ " * 900 + "true; " + "} " * 900 + "\n", ".sh", "nested deeper"),
    ("long sum", "X=$((" + "+".join(["2"] * 1500) + "))\n" + LAUNCH, ".sh", "nested deeper"),
    ("huge arithmetic", "X=$((" + "+".join(["12"] * 3000) + "))\n" + LAUNCH, ".sh", "at most 4,096"),
    ("stray paren", "X=$((3*(4+5)))) )\n" + LAUNCH, ".sh", "unexpected `\\)`"),
    ("deep default", "X=" + "${B:-" * 700 + "v" + "}" * 700 + "\n" + LAUNCH, ".sh", "nested deeper"),
    ("huge script", "# pad\n" * 300_000, ".sh", "an import is at most"),
    ("deep toml array", "[training]\nsteps = " + "[" * 3000 + "]" * 3000 + "\n", ".toml", "nested deeper"),
    ("deep inline table", "[job]\nx = " + "{ y = " * 50_000 + "1" + " }" * 50_000 + "\n", ".toml", "nested deeper"),
    ("dotted header", "[" + ".".join(["k"] * 200_000) + "]\n", ".toml", "dotted parts"),
    ("dotted key", "[training]\n" + ".".join(["q"] * 5_000) + " = 1\n", ".toml", "dotted parts"),
    ("deep json", "[" * 200_000 + "]" * 200_000, ".json", "nested too deeply"),
]


@pytest.mark.parametrize("name, text, suffix, message", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_input_is_one_bounded_error(name, text, suffix, message):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with pytest.raises(ImportFailed, match=message) as info:
        import_text(text, f"x{suffix}")
    assert time.perf_counter() - t0 < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300 * 1024  # KiB: < 300 MB grown
    first = str(info.value).splitlines()[0]
    assert first.startswith(f"x{suffix}") and len(first) < 400


def test_a_huge_file_is_refused_before_it_is_read_whole(tmp_path):
    path = tmp_path / "big.sh"
    with path.open("wb") as f:
        f.truncate(L.MAX_INPUT_CHARS * 4 + 10)  # sparse: nothing written, nothing to read
    with pytest.raises(ImportFailed, match="over .* bytes"):
        import_plan(path)


def test_bounds_leave_real_scripts_alone():
    """Bash's own 64-bit arithmetic still evaluates, and ordinary nesting and sizes pass."""
    text = (
        "GPUS=$((2**3))\nNODES=$(( (1 << 2) ))\nBIG=$((2**62 + (2**62 - 1)))\n"
        "ARGS=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512)\n"
        "if [ $GPUS -gt 4 ]; then\n  if [ 1 = 1 ]; then TP=2; fi\nfi\n"
        'torchrun --nproc_per_node $GPUS pretrain_gpt.py "${ARGS[@]}" --tensor-model-parallel-size ${TP:-1}\n'
    )
    imported = import_text(text, "ok.sh")
    assert imported.plan.tp == 2 and imported.model.layers == 4


SHELL_ATOMS = "A= $A ${A:- } $(( )) ** 9 * ( ) [ ] if then fi eval \" ' ; && { } ${A[@]} A=( torchrun --tp ` $(".split(
    " "
)
SHELL_ATOMS += [" ", "\n"]
TOML_ATOMS = ["[", "]", "{", "}", "a", ".", "=", " ", "\n", '"', "'", "1", ",", "#", "[[x]]", "training", "\\"]


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(st.sampled_from(SHELL_ATOMS), max_size=60), reps=st.integers(1, 40))
def test_fuzz_shell_import_is_a_plan_or_import_failed(parts, reps):
    text = "".join(parts) * reps
    try:
        import_text(text, "fuzz.sh")
    except ImportFailed as err:
        assert str(err)
    # anything else (RecursionError, MemoryError, OverflowError, ...) fails the test


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(st.sampled_from(TOML_ATOMS), max_size=60), reps=st.integers(1, 40))
def test_fuzz_toml_import_is_a_plan_or_import_failed(parts, reps):
    try:
        import_text("".join(parts) * reps, "fuzz.toml")
    except ImportFailed as err:
        assert str(err)
