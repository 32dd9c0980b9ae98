"""Text a user reads, whichever layer writes it: the one-line rule for every error (a message is one
printable line, whatever the names inside it -- file names, archive members, pasted sources --
contain), and a set of ranks in words.

Pure: stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable


def one_line(text: str) -> str:
    """`text` as one printable line: newlines, tabs and terminal escapes in names that came from
    files or archives are written as escapes (repr-style), so no name can split, colour or forge a
    line of output (e.g. a second `error:` line)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def rank_span(ranks: Iterable[int]) -> str:
    """'rank 3', 'ranks 0–7' (a contiguous run), 'ranks 0, 2, 5' (a few), 'ranks 0 … 1,023 (96)'."""
    ranks = sorted(set(int(r) for r in ranks))
    if not ranks:
        return "no ranks"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks[-1] - ranks[0] == len(ranks) - 1:
        return f"ranks {ranks[0]:,}–{ranks[-1]:,}"
    if len(ranks) <= 8:
        return "ranks " + ", ".join(f"{r:,}" for r in ranks)
    return f"ranks {ranks[0]:,} … {ranks[-1]:,} ({len(ranks):,})"
