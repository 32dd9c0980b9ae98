"""Every command README and docs/ show runs as written: the fenced bash lines that start with
`python -m` or `parascope`. The cheap ones (plan, search) run whole and must exit 0; the others
(they profile jobs, or read a file an earlier line of the example makes) must name a command that
exists and flags it accepts (its --help lists each flag the line gives)."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHEAP = re.compile(
    r"^(python -m parallel|parascope) (plan|search)\b(?!.*(--calibration|--links|--device-fit|--import))"
)


def commands() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip()
                if line.startswith(("python -m parallel", "python -m profiler", "parascope ")):
                    out.append((doc.relative_to(ROOT).as_posix(), line))
    return out


def _argv(line: str) -> list[str]:
    words = shlex.split(line)
    if words[0] == "parascope":
        words = ["python", "-m", "parascope.cli", *words[1:]]
    return [sys.executable, *words[1:]]


@pytest.mark.parametrize(("doc", "line"), commands(), ids=[f"{d}:{i}" for i, (d, _) in enumerate(commands())])
def test_documented_command_runs_or_parses(doc, line):
    argv = _argv(line)
    if CHEAP.match(line):
        r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{doc}: {line}\n{r.stderr[-2000:]}"
        return
    sub = argv[: argv.index("-m") + 3] if "-m" in argv else argv[:3]
    r = subprocess.run([*sub, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{doc}: {line}: no such command\n{r.stderr[-1000:]}"
    for flag in re.findall(r"\s(--[a-z][a-z0-9-]*)", " " + " ".join(argv[len(sub) :])):
        assert flag in r.stdout, f"{doc}: {line}: {flag} is not a flag of {' '.join(sub[2:])}"


def test_there_are_documented_commands():
    assert len(commands()) >= 10 and any(CHEAP.match(line) for _, line in commands())
