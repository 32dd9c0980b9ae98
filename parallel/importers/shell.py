"""The bash that launches training jobs, read into a syntax tree (the lexer and parser half of
`shell_eval`).

Launch scripts build their command line from variables (`TP=8`, `TP=${TP:-8}`, `$((64/TP))`),
arrays (`ARGS=(--a 1 --b 2)`, `ARGS+=(...)`), strings with line continuations and
`if [ "$X" == y ]; then ... fi` blocks. `parse(text)` returns the statements with their line
numbers; a word stays a list of parts (literal text, `$VAR`/`${...}`, `$(...)`, `$((...))`) so that
`shell_eval` can expand it with the variables of the moment. Loops, `case` and function bodies are
kept as opaque `skip` nodes: launch scripts set their plan outside them.

Raises ShellError(line, message) for text bash itself would reject (an unterminated quote, array,
`$(` or `if`). Pure: stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from parallel.importers.limits import MAX_DEPTH

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=")


class ShellError(ValueError):
    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


# ------------------------------------------------------------------ lexer
# A token is ("word", parts, line), ("op", text, line) or ("nl", None, line). A word's parts are
# (kind, text, quoted) with kind lit | var | cmd | arith, expanded later (variables change as we go).

OPS = ("&&", "||", "|&", ";;", ">>", "&>", ">&", ";", "&", "|", "(", ")", "<", ">")


def _closing(s: str, i: int, open_: str, close: str, line: int, what: str) -> int:
    """Index just past the `close` that balances the `open_` before s[i] (quotes respected)."""
    depth, quote = 1, None
    while i < len(s):
        c = s[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif s.startswith(open_, i):
            depth += 1
            i += len(open_) - 1
        elif s.startswith(close, i):
            depth -= 1
            if depth == 0:
                return i + len(close)
            i += len(close) - 1
        i += 1
    raise ShellError(line, f"unterminated {what}")


def _dollar(s: str, i: int, line: int, quoted: bool):
    """Parse the expansion at s[i] == '$'; returns (part, next index)."""
    if s.startswith("$((", i):  # ends at the `))` that balances it, parentheses inside counted one by one
        end = _closing(s, i + 2, "(", ")", line, "$(( arithmetic")
        if s[end - 2 : end] != "))":
            raise ShellError(line, "`$((` is closed by `)` alone; arithmetic ends with `))`")
        return ("arith", s[i + 3 : end - 2], quoted), end
    if s.startswith("$(", i):
        end = _closing(s, i + 2, "(", ")", line, "$( command substitution")
        return ("cmd", s[i:end], quoted), end
    if s.startswith("${", i):
        end = _closing(s, i + 2, "{", "}", line, "${ expansion")
        return ("var", s[i + 2 : end - 1], quoted), end
    m = NAME.match(s, i + 1)
    if m:
        return ("var", m.group(0), quoted), m.end()
    if i + 1 < len(s) and s[i + 1] in "0123456789@*#?$!-":
        return ("var", s[i + 1], quoted), i + 2
    return ("lit", "$", quoted), i + 1


def lex(s: str, first_line: int = 1) -> tuple[list[tuple], list[tuple[int, str]]]:
    tokens, comments, i, line, n = [], [], 0, first_line, len(s)
    in_test = False
    while i < n:
        c = s[i]
        if c == "\\" and s.startswith("\n", i + 1):
            i, line = i + 2, line + 1
        elif c in " \t\r":
            i += 1
        elif c == "\n":
            tokens.append(("nl", None, line))
            i, line = i + 1, line + 1
        elif c == "#":
            end = s.find("\n", i)
            end = n if end < 0 else end
            comments.append((line, s[i:end]))
            i = end
        elif c == "(" and (expr := _flag_list_value(s, i, tokens)):
            # bash would need it quoted; Megatron-LM's docs print `--moe-layer-freq ([0]*3+[1]*58)` bare
            tokens.append(("word", [("lit", expr, True)], line))
            i += len(expr)
        elif any(s.startswith(op, i) for op in OPS):
            op = next(op for op in OPS if s.startswith(op, i))
            if in_test and op in ("&&", "||", "<", ">", "(", ")"):
                tokens.append(("word", [("lit", op, False)], line))  # operators of [[ ... ]]
            else:
                tokens.append(("op", op, line))
            i += len(op)
        else:
            parts, start = [], line
            while i < n and s[i] not in " \t\r\n;&|()<>":
                c = s[i]
                if c == "\\":
                    if s.startswith("\n", i + 1):
                        line += 1
                    else:
                        parts.append(("lit", s[i + 1 : i + 2], True))
                    i += 2
                elif c == "'":
                    end = s.find("'", i + 1)
                    if end < 0:
                        raise ShellError(line, "unterminated single quote")
                    parts.append(("lit", s[i + 1 : end], True))
                    line += s.count("\n", i, end)
                    i = end + 1
                elif c == '"':
                    i, line = _double(s, i + 1, line, parts)
                elif c == "$":
                    part, j = _dollar(s, i, line, False)
                    line += s.count("\n", i, j)
                    parts.append(part)
                    i = j
                elif c == "`":
                    end = s.find("`", i + 1)
                    if end < 0:
                        raise ShellError(line, "unterminated backtick command substitution")
                    parts.append(("cmd", s[i : end + 1], False))
                    line += s.count("\n", i, end)
                    i = end + 1
                else:
                    j = i
                    while j < n and s[j] not in " \t\r\n;&|()<>\\'\"$`":
                        j += 1
                    parts.append(("lit", s[i:j], False))
                    i = j
            if (
                i < n
                and s[i] in "<>"
                and len(parts) == 1
                and parts[0][0] == "lit"
                and not parts[0][2]
                and parts[0][1].isdigit()
            ):
                continue  # a file descriptor, as in 2>&1
            tokens.append(("word", parts, start))
            if parts == [("lit", "[[", False)] or parts == [("lit", "]]", False)]:
                in_test = parts[0][1] == "[["
    return tokens, comments


LIST_EXPRESSION = re.compile(r"\([\[\]\d*+, ()]*\)")


def _flag_list_value(s: str, i: int, tokens: list) -> str | None:
    """The Python list expression at s[i] -- `([0]*3+[1]*58)`, balanced, on one line -- when it is the
    value of the long flag just before it (`--moe-layer-freq`), else None: a bare `(` there is a shell
    syntax error, so reading it as the flag's value changes no script bash can run."""
    prev = tokens[-1] if tokens else None
    if not (prev and prev[0] == "word" and all(k == "lit" for k, *_ in prev[1])):
        return None
    if not "".join(t for _, t, _ in prev[1]).startswith("--"):
        return None
    m = LIST_EXPRESSION.match(s, i)
    if not m:
        return None
    depth = 0
    for j, ch in enumerate(m.group()):  # the first balanced prefix: `(...)` and no more
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return m.group()[: j + 1]
    return None


def _double(s: str, i: int, line: int, parts: list) -> tuple[int, int]:
    start, buf = line, []
    while i < len(s):
        c = s[i]
        if c == '"':
            parts.append(("lit", "".join(buf), True))
            return i + 1, line
        if c == "\\" and i + 1 < len(s) and s[i + 1] in '$`"\\\n':
            if s[i + 1] == "\n":
                line += 1
            else:
                buf.append(s[i + 1])
            i += 2
        elif c == "$":
            parts.append(("lit", "".join(buf), True))
            buf = []
            part, j = _dollar(s, i, line, True)
            line += s.count("\n", i, j)
            parts.append(part)
            i = j
        elif c == "`":
            end = s.find("`", i + 1)
            if end < 0:
                raise ShellError(line, "unterminated backtick command substitution")
            parts.append(("lit", "".join(buf), True))
            buf = []
            parts.append(("cmd", s[i : end + 1], True))
            i = end + 1
        else:
            if c == "\n":
                line += 1
            buf.append(c)
            i += 1
    raise ShellError(start, "unterminated double quote")


# ------------------------------------------------------------------ parser


@dataclass
class Simple:
    """One simple command: assignments (name, append, value) then words; value is a word's parts,
    or a list of (parts, line) for an array."""

    line: int
    assigns: list[tuple[str, bool, object, int]] = field(default_factory=list)
    words: list[tuple[list, int]] = field(default_factory=list)
    connector: str = ";"  # how it joins the previous command: ; && ||


@dataclass
class If:
    line: int
    branches: list[tuple[list[Simple], list]]  # (condition commands, body)
    orelse: list


@dataclass
class Skip:
    line: int
    what: str


TERMINATORS = (";", "&", "&&", "||", "|", "|&", ";;")
REDIRECTS = ("<", ">", ">>", "&>", ">&")
DECLARE = ("export", "declare", "local", "readonly", "typeset")


def plain(parts: list) -> str | None:
    """The text of a word with no expansions (quotes removed), else None."""
    if all(kind == "lit" for kind, _, _ in parts):
        return "".join(text for _, text, _ in parts)
    return None


class Parser:
    def __init__(self, tokens: list[tuple], depth: int = 0):
        self.t, self.i = tokens, 0
        self.depth = depth  # nesting of lists being parsed (an eval's text starts at its caller's)

    def peek(self, k: int = 0) -> tuple | None:
        return self.t[self.i + k] if self.i + k < len(self.t) else None

    def at_word(self, *texts: str, k: int = 0) -> bool:
        tok = self.peek(k)
        return tok is not None and tok[0] == "word" and plain(tok[1]) in texts

    def parse_list(self, stops: tuple[str, ...] = (), opener: tuple[str, int] | None = None) -> list:
        if self.depth >= MAX_DEPTH:
            line = opener[1] if opener else (self.peek() or (None, None, 0))[2]
            raise ShellError(line, f"commands nested deeper than {MAX_DEPTH} levels")
        self.depth += 1
        try:
            return self._parse_list(stops, opener)
        finally:
            self.depth -= 1

    def _parse_list(self, stops: tuple[str, ...], opener: tuple[str, int] | None) -> list:
        nodes, connector = [], ";"
        while (tok := self.peek()) is not None:
            if tok[0] == "nl" or (tok[0] == "op" and tok[1] in TERMINATORS):
                if tok[0] == "op" and tok[1] in ("&&", "||"):
                    connector = tok[1]
                self.i += 1
                continue
            if (tok[0] == "word" and plain(tok[1]) in stops) or (tok[0] == "op" and tok[1] == ")" and ")" in stops):
                return nodes
            if tok[0] == "op" and tok[1] == ")":  # nothing would consume it: stop here, not loop on it
                raise ShellError(tok[2], "unexpected `)`")
            node = self.command()
            if isinstance(node, Simple):
                node.connector = connector
            connector = ";"
            nodes.append(node)
        if opener:
            raise ShellError(opener[1], f"`{opener[0]}` is never closed (expected {' or '.join(stops)})")
        return nodes

    def command(self) -> Simple | If | Skip | None:
        tok = self.peek()
        line = tok[2]
        if self.at_word("if"):
            return self.parse_if()
        if self.at_word("for", "while", "until", "select"):
            return self.skip_block(("do",), "done", "loop", line)
        if self.at_word("case"):
            return self.skip_block(("case",), "esac", "case", line, start_depth=0)
        if self.at_word("function") or (
            tok[0] == "word"
            and NAME.fullmatch(plain(tok[1]) or "")
            and self.peek(1) is not None
            and self.peek(1)[:2] == ("op", "(")
            and self.peek(2) is not None
            and self.peek(2)[:2] == ("op", ")")
        ):
            return self.skip_block(("{",), "}", "function", line)
        if tok[0] == "op" and tok[1] == "(":
            self.i += 1
            body = self.parse_list((")",), ("(", line))
            self.i += 1
            return If(line, [([], body)], [])  # a subshell: run its body
        if self.at_word("{"):
            self.i += 1
            body = self.parse_list(("}",), ("{", line))
            self.i += 1
            return If(line, [([], body)], [])
        return self.simple()

    def skip_block(self, openers: tuple[str, ...], closer: str, what: str, line: int, start_depth: int = 0) -> Skip:
        depth = start_depth
        while (tok := self.peek()) is not None:
            self.i += 1
            if tok[0] == "word" and plain(tok[1]) in openers:
                depth += 1
            elif tok[0] == "word" and plain(tok[1]) == closer:
                depth -= 1
                if depth <= 0:
                    return Skip(line, what)
        raise ShellError(line, f"{what} starting here is never closed with `{closer}`")

    def parse_if(self) -> If:
        line = self.peek()[2]
        branches, orelse = [], []
        while True:
            self.i += 1  # if / elif
            cond = self.parse_list(("then",), ("if", line))
            self.i += 1
            body = self.parse_list(("elif", "else", "fi"), ("if", line))
            branches.append((cond, body))
            if self.at_word("elif"):
                continue
            if self.at_word("else"):
                self.i += 1
                orelse = self.parse_list(("fi",), ("if", line))
            self.i += 1  # fi
            return If(line, branches, orelse)

    def simple(self) -> Simple:
        node = Simple(self.peek()[2])
        declaring = False
        while (tok := self.peek()) is not None:
            if tok[0] == "nl" or (tok[0] == "op" and tok[1] in TERMINATORS + (")",)):
                break
            self.i += 1
            if tok[0] == "op" and tok[1] in REDIRECTS:
                if self.peek() is not None and self.peek()[0] == "word":
                    self.i += 1  # the redirection's target
                continue
            if tok[0] == "op":
                raise ShellError(tok[2], f"unexpected `{tok[1]}`")
            parts, line = tok[1], tok[2]
            if not node.words and plain(parts) in DECLARE:
                declaring = True
                continue
            if declaring and (plain(parts) or "").startswith("-"):
                continue
            m = ASSIGN.match(parts[0][1]) if parts and parts[0][0] == "lit" and not parts[0][2] else None
            if m and (not node.words or declaring):
                rest = [("lit", parts[0][1][m.end() :], False)] + list(parts[1:])
                if plain(rest) == "" and self.peek() is not None and self.peek()[:2] == ("op", "("):
                    node.assigns.append((m.group(1), bool(m.group(2)), self.array(line), line))
                else:
                    node.assigns.append((m.group(1), bool(m.group(2)), rest, line))
                continue
            node.words.append((parts, line))
        return node

    def array(self, line: int) -> list:
        self.i += 1  # (
        items = []
        while (tok := self.peek()) is not None:
            self.i += 1
            if tok[0] == "op" and tok[1] == ")":
                return items
            if tok[0] == "word":
                items.append((tok[1], tok[2]))
            elif tok[0] == "op":
                raise ShellError(tok[2], f"unexpected `{tok[1]}` inside the array started on line {line}")
        raise ShellError(line, "array `(` is never closed with `)`")


def parse(text: str, first_line: int = 1) -> tuple[list, list[tuple[int, str]]]:
    """Statements of a script, and its comments (for `#SBATCH` directives)."""
    tokens, comments = lex(text, first_line)
    return Parser(tokens).parse_list(), comments
