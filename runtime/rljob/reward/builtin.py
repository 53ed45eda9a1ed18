"""Built-in verifiers."""

from __future__ import annotations

import re

from .registry import register_reward

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@register_reward("exact_match")
def exact_match(prompt: str, response: str, answer: str) -> float:
    """1 when the response (trimmed) is the answer."""
    return 1.0 if response.strip() == str(answer).strip() else 0.0


@register_reward("arith_partial")
def arith_partial(prompt: str, response: str, answer: str) -> float:
    """Partial credit for a number: 1 for the exact answer; otherwise up to 0.5 for
    digits right in the right places (aligned at the ones digit) and 0.1 for the
    right number of digits. A wrong number earns less the more digits it gets wrong."""
    answer = str(answer).strip()
    match = re.match(r"\s*(-?\d+)", response)
    if not match:
        return 0.0
    got = match.group(1)
    if got == answer:
        return 1.0
    width = max(len(got), len(answer))
    right = sum(1 for a, b in zip(reversed(got), reversed(answer)) if a == b)
    return 0.5 * right / width + (0.1 if len(got) == len(answer) else 0.0)


def _final_number(text: str) -> str | None:
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    if boxed:
        text = boxed[-1]
    elif "####" in text:
        text = text.rsplit("####", 1)[1]
    numbers = _NUMBER.findall(text.replace(",", ""))
    return numbers[-1] if numbers else None


@register_reward("math_answer")
def math_answer(prompt: str, response: str, answer: str) -> float:
    """1 when the response's final number (\\boxed{}, '#### n' or the last number)
    equals the answer's (GSM8K/DeepScaleR style answers work as they are)."""
    got, want = _final_number(response), _final_number(str(answer))
    if got is None or want is None:
        return 0.0
    try:
        return 1.0 if abs(float(got) - float(want)) < 1e-6 else 0.0
    except ValueError:
        return 0.0

