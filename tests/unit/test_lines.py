"""runfiles.lines: the text a user reads -- one printable line per message, a set of ranks in words."""

from __future__ import annotations

import pytest

from runfiles.lines import one_line, rank_span


@pytest.mark.parametrize(
    "ranks, text",
    [
        ([], "no ranks"),
        ([3], "rank 3"),  # not "ranks 3–3"
        ([3, 3], "rank 3"),
        ([0, 1, 2, 3], "ranks 0–3"),
        ([5, 0, 2], "ranks 0, 2, 5"),
        (list(range(0, 2048, 2)), "ranks 0 … 2,046 (1,024)"),
    ],
)
def test_rank_span(ranks, text):
    assert rank_span(ranks) == text


@pytest.mark.parametrize(
    "text, line",
    [("rank0.json", "rank0.json"), ("a\nerror: forged", "a\\nerror: forged"), ("\x1b[31mred", "\\x1b[31mred")],
)
def test_one_line_escapes_what_could_split_or_colour_a_line(text, line):
    assert one_line(text) == line
