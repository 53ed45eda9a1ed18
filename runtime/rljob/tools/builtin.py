"""The built-in tools: `calculator` and `python`."""

from __future__ import annotations

import ast
import operator
import time

from . import register_tool
from .sandbox import Limits, ToolResult, run_python

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64
MAX_DIGITS = 100


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression of real numbers (numbers, + - * / // % **,
    parentheses); a ValueError for anything else, a power past MAX_EXPONENT, a result
    past MAX_DIGITS digits or one that is not real (a negative number's root) (pure)."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression.strip()[:40]!r}") from None

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is over {MAX_EXPONENT}")
            out = _BINARY[type(node.op)](left, right)
            if isinstance(out, complex):
                raise ValueError(f"not a real number: {ast.unparse(node)[:40]!r}")
            if isinstance(out, int) and len(str(abs(out))) > MAX_DIGITS:
                raise ValueError(f"a result over {MAX_DIGITS} digits")
            return out
        raise ValueError(f"not arithmetic: {ast.unparse(node)[:40]!r}")

    try:
        return value(tree.body)
    except (ZeroDivisionError, OverflowError) as exc:
        raise ValueError(str(exc)) from None


@register_tool("calculator")
def calculator(arguments: str, limits: Limits = Limits()) -> ToolResult:
    started = time.monotonic()
    try:
        out = evaluate(arguments)
    except ValueError as exc:
        return ToolResult("", str(exc), time.monotonic() - started)
    text = repr(out) if isinstance(out, int) else f"{out:.10g}"
    return ToolResult(text, "", time.monotonic() - started)


@register_tool("python")
def python(arguments: str, limits: Limits = Limits()) -> ToolResult:
    return run_python(arguments, limits)
