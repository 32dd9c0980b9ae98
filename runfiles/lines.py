"""The one-line rule for every error a user reads: a message is one printable line, whatever the
names inside it (file names, archive members, pasted sources) contain.

Pure: stdlib only.
"""

from __future__ import annotations


def one_line(text: str) -> str:
    """`text` as one printable line: newlines, tabs and terminal escapes in names that came from
    files or archives are written as escapes (repr-style), so no name can split, colour or forge a
    line of output (e.g. a second `error:` line)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
