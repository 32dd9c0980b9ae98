"""Megatron-LM's `--moe-layer-freq` -> which layers are MoE, one 0/1 per layer.

Megatron-LM (megatron/training/arguments.py, moe_freq_type and _eval_pattern) accepts an integer N
-- layer i is MoE when i % N == 0 (megatron/core/models/gpt/gpt_layer_specs.py) -- or a Python list
expression made of digits, `[`, `]`, `(`, `)`, `,`, `+` and `*` only, which it hands to `eval`:
`([0]*3+[1]*58)` is DeepSeek-V3's three dense layers then 58 MoE ones, `[1,0]*24` alternates. The
result must be a list of one entry per layer (gpt_layer_specs.py asserts the length).

This module evaluates the same grammar without `eval`: integers, list displays, `+` (list
concatenation, integer sum), `*` (list repetition, integer product) and parentheses, with Python's
precedence; every size is bounded before anything is built. Pure: stdlib only.
"""

from __future__ import annotations

import re

from parallel.core.specs import SHAPE_LIMITS
from parallel.importers.limits import MAX_DEPTH

MAX_LENGTH = SHAPE_LIMITS["layers"]  # entries of a pattern: one per layer
MAX_INT = 1 << 20  # any integer in the expression or formed by it
ALLOWED = re.compile(r"[,\d\[\]\(\)\+\*\s]*")  # Megatron-LM's _eval_pattern character set (and spaces)


class PatternError(ValueError):
    """A --moe-layer-freq value Megatron-LM would refuse, or one past this reader's bounds."""


def moe_layer_flags(text: str, layers: int) -> tuple[int, ...]:
    """The per-layer 0/1 pattern `--moe-layer-freq text` gives a model of `layers` layers."""
    text = text.strip()
    if "[" not in text:  # Megatron-LM: int(x)
        try:
            every = int(text)
        except ValueError:
            raise PatternError(
                f"expects an integer or a list expression such as ([0]*3+[1]*58), got {text!r}"
            ) from None
        if every < 1:
            raise PatternError(f"must be at least 1 (layer i is MoE when i % N == 0), got {every}")
        return tuple(int(i % every == 0) for i in range(layers))
    value = evaluate(text)
    if not isinstance(value, list):
        raise PatternError(f"{text!r} is not a list")
    if any(not isinstance(v, int) or v not in (0, 1) for v in value):
        raise PatternError(f"{text!r} must hold only 0 (dense) and 1 (MoE) entries")
    if len(value) != layers:
        raise PatternError(f"{text!r} has {len(value)} entries, but the model has {layers} layers")
    return tuple(value)


def evaluate(text: str) -> int | list:
    """The value of a pattern expression, as Python's eval would give it (tuples refused)."""
    if not ALLOWED.fullmatch(text):
        raise PatternError(f"{text!r} may hold only digits, [ ] ( ) , + * (Megatron-LM's rule)")
    if "**" in text:
        raise PatternError(f"{text!r} raises to a power (**): write the count out")
    parser = _Parser(re.findall(r"\d+|[\[\]\(\),\+\*]", text))
    value = parser.expr(0)
    if parser.pos != len(parser.tokens):
        raise PatternError(f"{text!r}: unexpected {parser.tokens[parser.pos]!r}")
    return value


class _Parser:
    def __init__(self, tokens: list[str]):
        self.tokens, self.pos = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, token: str):
        if self.peek() != token:
            raise PatternError(f"expected {token!r}, got {self.peek() or 'the end'}")
        self.pos += 1

    def expr(self, depth: int):
        value = self.term(depth)
        while self.peek() == "+":
            self.pos += 1
            value = _add(value, self.term(depth))
        return value

    def term(self, depth: int):
        value = self.atom(depth)
        while self.peek() == "*":
            self.pos += 1
            value = _mul(value, self.atom(depth))
        return value

    def atom(self, depth: int):
        if depth > MAX_DEPTH:
            raise PatternError(f"nested more than {MAX_DEPTH} deep")
        token = self.peek()
        if token is None:
            raise PatternError("ends where a value is expected")
        self.pos += 1
        if token.isdigit():
            if len(token) > 1 and token[0] == "0":
                raise PatternError(f"{token}: Python refuses leading zeros")
            return _int(int(token))
        if token == "(":
            value = self.expr(depth + 1)
            if self.peek() == ",":
                raise PatternError("a tuple is not a list: Megatron-LM refuses it")
            self.take(")")
            return value
        if token == "[":
            items: list = []
            while self.peek() != "]":
                items.append(self.expr(depth + 1))
                _length(len(items))
                if self.peek() != ",":
                    break
                self.pos += 1
            self.take("]")
            return items
        raise PatternError(f"unexpected {token!r}")


def _int(value: int) -> int:
    if abs(value) > MAX_INT:
        raise PatternError(f"{value} is past any layer count (at most {MAX_INT:,})")
    return value


def _length(n: int) -> int:
    if n > MAX_LENGTH:
        raise PatternError(f"a list of {n:,} entries is past any model (at most {MAX_LENGTH:,} layers)")
    return n


def _add(a, b):
    if isinstance(a, list) and isinstance(b, list):
        _length(len(a) + len(b))
        return a + b
    if isinstance(a, int) and isinstance(b, int):
        return _int(a + b)
    raise PatternError("+ joins two lists or two integers, not a list and an integer")


def _mul(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return _int(a * b)
    if isinstance(a, list) and isinstance(b, int):
        _length(len(a) * max(b, 0))
        return a * b
    if isinstance(a, int) and isinstance(b, list):
        return _mul(b, a)
    raise PatternError("* repeats a list by an integer; two lists cannot be multiplied")
