"""`profiler run --inject-hang RANK:STEP[:KIND]`: which rank misbehaves, at which step, how
(parallel.engine.flight carries it out in the rank). Pure: stdlib only, so the launcher can check
the flag without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

INJECT_ENV = "PARASCOPE_INJECT_HANG"
KINDS = ("skip", "size", "op")


@dataclass(frozen=True)
class Injection:
    rank: int
    step: int
    kind: str = "skip"


def parse_injection(text: str | None) -> Injection | None:
    """RANK:STEP[:KIND] -> Injection; ValueError saying what is wrong."""
    if not text:
        return None
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"--inject-hang {text!r}: expected RANK:STEP[:KIND], e.g. 3:2:skip")
    try:
        rank, step = int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(f"--inject-hang {text!r}: RANK and STEP are integers") from None
    kind = parts[2] if len(parts) == 3 else "skip"
    if kind not in KINDS:
        raise ValueError(f"--inject-hang {text!r}: KIND is one of {', '.join(KINDS)}")
    if rank < 0 or step < 0:
        raise ValueError(f"--inject-hang {text!r}: RANK and STEP are >= 0")
    return Injection(rank, step, kind)
