"""calc: a tiny calculator package for the parallel_tests recipe."""

from .core import add, fib, mean, mul, parse_expr, total

__all__ = ["add", "mul", "fib", "mean", "total", "parse_expr"]
