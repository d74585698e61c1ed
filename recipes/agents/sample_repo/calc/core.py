"""Arithmetic helpers. total() and mean() follow $CALC_BACKEND:
"exact" (default) uses fractions.Fraction, "fast" uses floats."""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Iterable, List, Union

Number = Union[int, float, Fraction]


def backend() -> str:
    return os.environ.get("CALC_BACKEND", "exact")


def add(a: Number, b: Number) -> Number:
    return a + b


def mul(a: Number, b: Number) -> Number:
    return a * b


def fib(n: int) -> int:
    if n < 0:
        raise ValueError("fib of a negative number")
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _num(s: str) -> Number:
    if backend() == "fast":
        return float(s)
    return Fraction(s)


def total(values: Iterable[str]) -> Number:
    """Sum decimal strings ("0.1", "2")."""
    acc: Number = 0
    for v in values:
        acc = acc + _num(v)
    return acc


def mean(values: Iterable[str]) -> Number:
    vals: List[str] = list(values)
    if not vals:
        raise ValueError("mean of nothing")
    return total(vals) / len(vals)


def parse_expr(expr: str) -> Number:
    """Evaluate "a op b" with op in + - * /."""
    parts = expr.split()
    if len(parts) != 3 or parts[1] not in "+-*/":
        raise ValueError("want 'a op b', got %r" % expr)
    a, op, b = _num(parts[0]), parts[1], _num(parts[2])
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b
