"""Text that came from a user or a file (a run or set name, a note, an author, an error naming a
file, a URL parameter), made safe to place inside Streamlit Markdown: it is shown as the text it
is, never rendered -- no image is fetched, no link or heading appears, no colour or LaTeX applies.

    st.error(f"Rejected **{md(name)}**: {md(message)}")

Pure: stdlib only.
"""

from __future__ import annotations

import re

from parallel.core.specs import GiB

MiB = 2**20

# What can start Markdown or a Streamlit directive inside a line: emphasis, code, links and images,
# HTML, LaTeX, tables, strikethrough. Other punctuation stays as it is, so messages read the same.
_INLINE = re.compile(r"([\\`*_\[\]<>!$|~])")
_LINE_START = re.compile(r"(?m)^(\s*)(\d+(?=[.)])|)([#>+\-=]|(?<=\d)[.)])")  # headings, quotes, lists, rules
_AUTOLINK = re.compile(r"(?i)(://|www\.|@|:(?=[a-z]))")  # autolinks, e-mail, :emoji: and :directive[...]


def md(value: object) -> str:
    """`value` as Markdown that renders to exactly its text: the characters that could start
    Markdown or a Streamlit directive are backslash-escaped (CommonMark allows it for any
    punctuation), and the shapes autolinks and shortcodes are found by get a zero-width space."""
    text = _AUTOLINK.sub(lambda m: m.group(0)[0] + "\u200b" + m.group(0)[1:], str(value))
    text = _INLINE.sub(r"\\\1", text)
    return _LINE_START.sub(lambda m: m.group(1) + m.group(2) + "\\" + m.group(3), text)


def error_md(value: object) -> str:
    """An error message as Markdown: its first line as text (md), the lines it quotes below it (an
    importer's `   33 | --mamba-num-heads 64`) as a code block, so the quoted line is not run into
    the sentence and shows exactly as it stands in the file."""
    head, _, quoted = str(value).partition("\n")
    if not quoted.strip():
        return md(head)
    fence = "`" * max([3, *(len(run) + 1 for run in re.findall(r"`+", quoted))])  # longer than any run inside
    return f"{md(head)}\n\n{fence}\n{quoted.strip(chr(10))}\n{fence}"


def bytes_text(n: float) -> str:
    """12.5 MiB, 3.1 GiB, 96 KiB: a metric's value in the unit that keeps it readable (a tiny model's
    layer is a few hundred KiB, which '0 MiB' hid)."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:,.3g} {unit}" if abs(n) < 100 * size else f"{n / size:,.0f} {unit}"
    return f"{n:,.0f} B"


def plural(n: int, noun: str) -> str:
    """'1 collective', '2 collectives', '1,024 ranks'."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
