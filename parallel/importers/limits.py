"""What one import may cost: every importer reads untrusted text (a pasted script, an uploaded TOML,
a URL's plan), so input size, nesting depth, evaluation steps, value sizes and integer widths are
capped here, in the shared mechanism, and each cap is a clear error naming the line.

Launch scripts and configs are a few KB with a handful of nesting levels; the caps are orders of
magnitude above that and far below what would hold the server.

Pure: stdlib only.
"""

from __future__ import annotations

from runfiles.lines import one_line

MAX_INPUT_CHARS = 1 << 20  # one imported text: 1 Mi characters
MAX_DEPTH = 64  # nested if / ( ) / { } / eval / sh -c / ${...} / $((...)), TOML arrays and tables
MAX_STEPS = 200_000  # statements and expansions evaluated in one script
MAX_VALUE_CHARS = 1 << 16  # one variable's value or one word
MAX_ENV_CHARS = 1 << 22  # all variables of a script together
MAX_WORDS = 10_000  # one array or one command line
MAX_INT_BITS = 63  # shell arithmetic: signed 64-bit integers, as bash's
MAX_ARITH_CHARS = 4096  # one $((...)) after expansion
MAX_KEY_PARTS = 32  # dotted parts of one TOML key or table header


def toml_shape_error(text: str) -> tuple[int, str] | None:
    """(line, why) when a TOML text nests arrays/inline tables deeper than MAX_DEPTH or has a key or
    header of more than MAX_KEY_PARTS dotted parts (tomllib recurses on the first and is quadratic in
    the second), else None. One pass over the characters, strings and comments skipped."""
    depth, parts, line, i, n = 0, 1, 1, 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            quote = text[i : i + 3] if text[i : i + 3] in ('"""', "'''") else c
            i += len(quote)
            while i < n and text[i : i + len(quote)] != quote:
                if text[i] == "\\" and quote[0] == '"':
                    i += 1
                line += text[i] == "\n" if i < n else 0
                i += 1
            i += len(quote)
            continue
        if c == "#":
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "\n":
            line, parts = line + 1, 1
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return line, f"arrays or tables nested deeper than {MAX_DEPTH} levels"
        elif c in "]}":
            depth = max(0, depth - 1)
        elif c == ".":
            parts += 1
            if parts > MAX_KEY_PARTS:
                return line, f"a key or header of more than {MAX_KEY_PARTS} dotted parts"
        elif c in "=,":
            parts = 1
        i += 1
    return None


def input_error(name: str, chars: int) -> str | None:
    """Why a text of `chars` characters is not imported, or None."""
    if chars > MAX_INPUT_CHARS:
        return f"{one_line(name)}: {chars:,} characters; an import is at most {MAX_INPUT_CHARS:,} (launch scripts are a few KB)"
    return None
