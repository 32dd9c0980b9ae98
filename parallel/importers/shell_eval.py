"""Walk a launch script the way bash would, without running anything: the commands it would run.

`run(text)` keeps the script's variables and arrays as it goes, expands `$X`, `${X:-default}`,
`${X:=v}`, `${X:+v}`, `${#X}`, `${A[@]}`, `$((arithmetic))`, splits unquoted expansions into words,
takes the branch of `if` whose `[ ... ]` / `[[ ... ]]` test holds, follows `eval "..."` and
`sh -c "..."`, and returns every simple command with each word's line. What it cannot know stays
visible: a command substitution (`$(nvidia-smi ...)`, backticks) expands to a marked placeholder
(`UNRESOLVED`), a test it cannot decide is taken as false, and each such place is noted with its line.
Nothing is read from this machine's environment; `env=` seeds variables (e.g. from `#SBATCH`).

Pure: stdlib only.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from parallel.importers.limits import (
    MAX_ARITH_CHARS,
    MAX_DEPTH,
    MAX_ENV_CHARS,
    MAX_INT_BITS,
    MAX_STEPS,
    MAX_VALUE_CHARS,
    MAX_WORDS,
)
from parallel.importers.shell import NAME, If, Parser, ShellError, Simple, Skip, lex, parse, plain

Reader = Callable[[str], "str | None"]  # a sourced file's name -> its text, or None when it cannot be read
UNRESOLVED = "\x00"  # prefix of text that came from a command this reader does not run
__all__ = ["Reader", "Result", "ShellError", "UNRESOLVED", "Word", "commands_in_values", "run"]


@dataclass(frozen=True)
class Word:
    text: str
    line: int


@dataclass
class Result:
    commands: list[list[Word]] = field(default_factory=list)
    env: dict[str, list[Word]] = field(default_factory=dict)  # arrays and scalars (one Word)
    notes: list[str] = field(default_factory=list)
    unset: dict[str, int] = field(default_factory=dict)  # variables used but never set -> first line
    comments: list[tuple[int, str]] = field(default_factory=list)


def _short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _pow(a: int, b: int) -> int:
    if b < 0:
        raise ValueError("negative exponent")
    if abs(a) > 1 and b > MAX_INT_BITS:  # |a|**b has more than b bits: refuse before computing it
        raise OverflowError
    return a**b


_ARITH = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: lambda a, b: int(a / b),
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _pow,
}


def _arith(node: ast.AST, depth: int = 0) -> int:
    """Integer arithmetic as bash's $((...)), every intermediate within signed 64 bits (OverflowError
    beyond), nested at most MAX_DEPTH deep (RecursionError beyond); ValueError for anything else."""
    if depth > MAX_DEPTH:
        raise RecursionError
    if isinstance(node, ast.Expression):
        return _arith(node.body, depth + 1)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        value = node.value
    elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        value = _ARITH[type(node.op)](_arith(node.left, depth + 1), _arith(node.right, depth + 1))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _arith(node.operand, depth + 1)
        value = -inner if isinstance(node.op, ast.USub) else inner
    else:
        raise ValueError("not integer arithmetic")
    if value.bit_length() > MAX_INT_BITS:
        raise OverflowError
    return value


class Shell:
    def __init__(self, env: dict[str, str] | None = None, read: Reader | None = None):
        self.r = Result(env={k: [Word(str(v), 0)] for k, v in (env or {}).items()})
        self.read = read  # name -> the text of a file a script sources, or None when it cannot be read
        self.steps = 0  # statements and expansions evaluated (MAX_STEPS)
        self.depth = 0  # if / eval / expansions being evaluated inside one another (MAX_DEPTH)
        self.env_chars = sum(len(w.text) for words in self.r.env.values() for w in words)

    # ------------------------------------------------------------ bounds (parallel.importers.limits)
    def tick(self, line: int) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise ShellError(line, f"evaluation stopped after {MAX_STEPS:,} steps (an eval that calls itself?)")

    @contextmanager
    def deeper(self, line: int, what: str) -> Iterator[None]:
        self.tick(line)
        if self.depth >= MAX_DEPTH:
            raise ShellError(line, f"{what} nested deeper than {MAX_DEPTH} levels")
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def sized(self, words: list[Word], line: int) -> list[Word]:
        """`words`, or ShellError when there are too many or one is too long."""
        if len(words) > MAX_WORDS:
            raise ShellError(line, f"more than {MAX_WORDS:,} words")
        for w in words:
            if len(w.text) > MAX_VALUE_CHARS:
                raise ShellError(line, f"a value of {len(w.text):,} characters (at most {MAX_VALUE_CHARS:,})")
        return words

    def store(self, name: str, words: list[Word], line: int) -> None:
        """Set a variable, keeping all of them together under MAX_ENV_CHARS."""
        self.sized(words, line)
        old = sum(len(w.text) for w in self.r.env.get(name, []))
        self.env_chars += sum(len(w.text) for w in words) - old
        if self.env_chars > MAX_ENV_CHARS:
            raise ShellError(line, f"the script's variables hold over {MAX_ENV_CHARS:,} characters")
        self.r.env[name] = words

    def note(self, line: int, text: str) -> None:
        msg = f"line {line}: {text}"
        if msg not in self.r.notes:
            self.r.notes.append(msg)

    # ------------------------------------------------------------ statements
    def run(self, nodes: list) -> None:
        for node in nodes:
            self.tick(node.line)
            if isinstance(node, Simple):
                self.simple(node)
            elif isinstance(node, If):
                self.branch(node)
            elif isinstance(node, Skip):
                self.note(node.line, f"{node.what} not followed (its body is not read)")

    def branch(self, node: If) -> None:
        for cond, body in node.branches:
            verdict = self.condition(cond)
            if verdict is None and _sets_something(body):
                self.note(node.line, "a test this reader cannot decide was taken as false")
            if verdict:
                with self.deeper(node.line, "if"):
                    self.run(body)
                return
        with self.deeper(node.line, "if"):
            self.run(node.orelse)

    def condition(self, cond: list[Simple]) -> bool | None:
        """`a && b || c` the way bash short-circuits it; None where a test cannot be decided."""
        if not cond:
            return True
        value: bool | None = None
        for i, cmd in enumerate(cond):
            if i and ((cmd.connector == "&&" and value is False) or (cmd.connector == "||" and value is True)):
                continue
            self.assign(cmd)
            result = self.test([w for parts, line in cmd.words for w in self.expand(parts, line)])
            if i and cmd.connector == "&&":
                value = False if False in (value, result) else None if None in (value, result) else True
            elif i and cmd.connector == "||":
                value = True if True in (value, result) else None if None in (value, result) else False
            else:
                value = result
        return value

    def simple(self, node: Simple) -> None:
        self.assign(node)
        argv = [w for parts, line in node.words for w in self.expand(parts, line)]
        if not argv:
            return
        head = argv[0].text
        shell_c = _shell_c(argv)
        if head == "eval":
            self.nested(" ".join(w.text for w in argv[1:]), node.line)
        elif shell_c is not None:  # sh -c "...", also behind srun / docker exec
            self.nested(argv[shell_c].text, node.line)
        elif head in (".", "source"):
            name = argv[1].text if len(argv) > 1 else ""
            text = self.read(name) if self.read is not None and name and UNRESOLVED not in name else None
            if text is None:
                where = "it is not a file beside the script" if self.read is not None else "other files are not read"
                self.note(node.line, f"`{head} {name}` not read ({where}): what it sets is unknown")
            else:
                self.note(node.line, f"`{head} {name}`: read from the file beside the script (not executed)")
                self.nested(text, node.line)
        elif head == "unset":
            for w in argv[1:]:
                self.r.env.pop(w.text, None)
        else:
            self.r.commands.append(argv)

    def nested(self, text: str, line: int) -> None:
        if UNRESOLVED in text:
            self.note(line, "eval of text that holds an unresolved command substitution")
        with self.deeper(line, "eval"):
            tokens, _ = lex(text.replace(UNRESOLVED, ""), line)
            self.run(Parser([(k, v, line) for k, v, _ in tokens], depth=self.depth).parse_list())

    def assign(self, node: Simple) -> None:
        for name, append, value, line in node.assigns:
            if (
                isinstance(value, list)
                and value
                and isinstance(value[0], tuple)
                and len(value[0]) == 2
                and isinstance(value[0][0], list)
            ):
                words = [w for parts, ln in value for w in self.expand(parts, ln)]
            elif isinstance(value, list) and value == []:
                words = []
            else:
                text = self.expand_joined(value, line)
                words = [Word(text, line)]
                if append and name in self.r.env:
                    old = self.r.env[name]
                    words = (
                        [Word((old[0].text if old else "") + text, line)] + old[1:] if len(old) <= 1 else old + words
                    )
                    append = False
            self.store(name, (self.r.env.get(name, []) + words) if append else words, line)

    # ------------------------------------------------------------ expansion
    def expand(self, parts: list, line: int) -> list[Word]:
        """Fields of one word after expansion and splitting of its unquoted expansions."""
        fields: list[list[str]] = [[]]
        alive = [False]
        lines = [line]
        for kind, text, quoted in parts:
            if kind == "lit":
                fields[-1].append(text)
                alive[-1] = alive[-1] or quoted or bool(text)
                continue
            values = self.part(kind, text, line)
            for k, value in enumerate(values):
                if quoted:
                    if k:
                        fields.append([]), alive.append(False), lines.append(line)
                    fields[-1].append(value.text)
                    alive[-1] = True
                    if value.line:
                        lines[-1] = value.line
                    continue
                pieces = [value.text] if value.text.startswith(UNRESOLVED) else value.text.split()
                if k and alive[-1]:
                    fields.append([]), alive.append(False), lines.append(line)
                if not pieces:
                    continue
                if value.text[:1].isspace() and alive[-1]:
                    fields.append([]), alive.append(False), lines.append(line)
                for j, piece in enumerate(pieces):
                    if j:
                        fields.append([]), alive.append(False), lines.append(line)
                    fields[-1].append(piece)
                    alive[-1] = True
                    if value.line:
                        lines[-1] = value.line
                if value.text[-1:].isspace():
                    fields.append([]), alive.append(False), lines.append(line)
        return self.sized([Word("".join(f), ln) for f, a, ln in zip(fields, alive, lines) if a], line)

    def expand_joined(self, parts: list, line: int) -> str:
        """A word expanded without splitting (assignment values, defaults)."""
        out = []
        for kind, text, _ in parts:
            out.append(text if kind == "lit" else " ".join(w.text for w in self.part(kind, text, line)))
        return self.sized([Word("".join(out), line)], line)[0].text

    def expand_text(self, text: str, line: int) -> str:
        tokens, _ = lex(text, line)
        return " ".join(self.expand_joined(tok[1], line) for tok in tokens if tok[0] == "word")

    def part(self, kind: str, text: str, line: int) -> list[Word]:
        with self.deeper(line, "expansions"):
            return self._part(kind, text, line)

    def _part(self, kind: str, text: str, line: int) -> list[Word]:
        if kind == "cmd":
            if not any(f"`{text}` is a command" in n for n in self.r.notes):
                self.note(line, f"`{text}` is a command substitution; it is not run")
            return [Word(UNRESOLVED + text, 0)]
        if kind == "arith":
            return [Word(self.arith(text, line), 0)]
        return self.var(text, line)

    def arith(self, text: str, line: int) -> str:
        expanded = self.expand_text('"' + text.replace('"', "") + '"', line)
        if UNRESOLVED not in expanded:
            expanded = NAME.sub(lambda m: self.scalar(m.group(0)) or "0", expanded)
            if len(expanded) > MAX_ARITH_CHARS:
                raise ShellError(line, f"`$((...))` of {len(expanded):,} characters (at most {MAX_ARITH_CHARS:,})")
            try:
                return str(_arith(ast.parse(expanded.strip(), mode="eval")))
            except OverflowError:
                raise ShellError(line, f"`$(({_short(text)}))` exceeds {MAX_INT_BITS + 1}-bit integers") from None
            except RecursionError:
                raise ShellError(line, f"`$(({_short(text)}))` nested deeper than {MAX_DEPTH} levels") from None
            except (SyntaxError, ValueError, ZeroDivisionError, TypeError, MemoryError):
                pass
        self.note(line, f"`$(({text}))` could not be evaluated")
        return UNRESOLVED + f"$(({text}))"

    def scalar(self, name: str) -> str | None:
        words = self.r.env.get(name)
        return words[0].text if words else None

    def var(self, expr: str, line: int) -> list[Word]:
        m = re.fullmatch(r"#([A-Za-z_]\w*)(\[[@*]\])?", expr)
        if m:
            words = self.r.env.get(m.group(1), [])
            return [Word(str(len(words) if m.group(2) else len(words[0].text) if words else 0), 0)]
        m = re.fullmatch(r"([A-Za-z_]\w*|[0-9@*#?$!-])(?:\[([^\]]+)\])?(.*)", expr, re.S)
        if not m:
            self.note(line, f"`${{{expr}}}` not understood")
            return []
        name, index, op = m.groups()
        if name in ("@", "*"):
            return []
        if name in ("#", "?", "$", "!", "-"):
            return [Word("0", 0)]
        words = self.r.env.get(name)
        if words is not None and index not in (None, "@", "*"):
            try:
                words = [words[int(index)]] if int(index) < len(words) else []
            except ValueError:
                words = words[:1]
        elif words is not None and index is None:
            words = words[:1]
        is_set = words is not None
        empty = not words or all(w.text == "" for w in words)
        if op:
            for sym in (":-", ":=", ":+", ":?", "-", "=", "+", "?"):
                if op.startswith(sym):
                    arg = op[len(sym) :]
                    missing = (not is_set or empty) if sym.startswith(":") else not is_set
                    if sym.endswith("+"):
                        return [Word(self.expand_text(arg, line), 0)] if not missing else [Word("", 0)]
                    if not missing:
                        return words
                    if sym.endswith("?"):
                        self.r.unset.setdefault(name, line)
                        return [Word("", 0)]
                    value = Word(self.expand_text(arg, line), line)
                    if sym.endswith("="):
                        self.store(name, [value], line)
                    return [value]
            self.note(line, f"`${{{expr}}}`: this substitution is not evaluated; the plain value is used")
        if not is_set:
            if NAME.fullmatch(name):
                self.r.unset.setdefault(name, line)
            return [Word("", 0)] if index not in ("@", "*") else []
        return words

    # ------------------------------------------------------------ tests
    def test(self, argv: list[Word]) -> bool | None:
        words = [w.text for w in argv]
        if not words:
            return None
        if words[0] == "!":
            inner = self.test(argv[1:])
            return None if inner is None else not inner
        if words[0] in ("true", ":"):
            return True
        if words[0] == "false":
            return False
        if words[0] in ("[", "[["):
            if words[-1] != {"[": "]", "[[": "]]"}[words[0]]:
                return None
            words = words[1:-1]
        elif words[0] == "test":
            words = words[1:]
        else:
            return None
        return _test(words)


QUIET = ("echo", "printf", "exit", "return", "mkdir", "rm", "cd", "touch", "sleep", "set", "unset", "export")


def _shell_c(argv: list[Word]) -> int | None:
    """The index of the command string of `sh -c "..."` / `bash -x -c "..."` / `bash -lc "..."` in
    argv (also behind srun / docker exec), or None."""
    for i, w in enumerate(argv):
        if w.text.rsplit("/", 1)[-1] not in ("sh", "bash"):
            continue
        for j in range(i + 1, len(argv) - 1):
            opt = argv[j].text
            if not opt.startswith("-"):
                break
            if not opt.startswith("--") and "c" in opt[1:]:  # -c, or short options run together with it
                return j + 1
    return None


def _sets_something(body: list) -> bool:
    """Whether skipping `body` could change the launch: it assigns, or runs more than bookkeeping."""
    for node in body:
        if isinstance(node, If) and any(_sets_something(b) for _, b in node.branches + [([], node.orelse)]):
            return True
        if isinstance(node, Simple) and (node.assigns or (node.words and plain(node.words[0][0]) not in QUIET)):
            return True
    return False


def _test(w: list[str]) -> bool | None:
    for ors in ("||", "-o"), ("&&", "-a"):
        for i in range(len(w) - 1, 0, -1):
            if w[i] in ors:
                left, right = _test(w[:i]), _test(w[i + 1 :])
                if ors[0] == "||":
                    return True if True in (left, right) else None if None in (left, right) else False
                return False if False in (left, right) else None if None in (left, right) else True
    if w and w[0] == "!":
        inner = _test(w[1:])
        return None if inner is None else not inner
    if any(UNRESOLVED in x for x in w):
        return None
    if len(w) == 1:
        return w[0] != ""
    if len(w) == 2:
        op, x = w
        return {"-z": x == "", "-n": x != ""}.get(op)
    if len(w) == 3:
        a, op, b = w
        if op in ("==", "="):
            return a == b
        if op == "!=":
            return a != b
        ops = {
            "-eq": operator.eq,
            "-ne": operator.ne,
            "-gt": operator.gt,
            "-lt": operator.lt,
            "-ge": operator.ge,
            "-le": operator.le,
        }
        if op in ops:
            try:
                return ops[op](int(a), int(b))
            except ValueError:
                return None
    return None


def run(text: str, env: dict[str, str] | None = None, read: Reader | None = None) -> Result:
    """The commands a launch script would run, with its variables at the end; ShellError if malformed.
    `read(name)`: the text of a file the script sources (`. name`, `source name`), or None; without
    it sourced files are noted as unread."""
    nodes, comments = parse(text)
    shell = Shell(env, read)
    shell.r.comments = comments
    shell.run(nodes)
    return shell.r


def commands_in_values(result: Result) -> list[tuple[str, Word, list[list[Word]]]]:
    """(name, its value, the commands it would run) for each one-word variable whose value holds `--`
    flags, read as `bash -c "$NAME"` would run it, or where that is not valid shell (`--moe-layer-freq
    ([0]*3+[1]*58)`) split into words as an unquoted `$NAME` on a command line is. Launch scripts build
    the training command in a variable (`CMD="... python pretrain_gpt.py ${ARGS[@]}"`) and start it
    from an sbatch heredoc or an srun this reader does not follow; model files keep the arguments
    alone (`MODEL_ARGS="--num-layers 94 ..."`)."""
    found = []
    for name, words in result.env.items():
        if len(words) != 1 or " --" not in f" {words[0].text}":
            continue
        value = words[0]
        shell = Shell()
        shell.r.env = dict(result.env)
        try:
            shell.nested(value.text, value.line)
            commands = shell.r.commands
        except ShellError:
            commands = [[Word(text, value.line) for text in value.text.split()]]
        if commands:
            found.append((name, value, commands))
    return found
