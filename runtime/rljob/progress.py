"""What `rljob run` tells about a job as it goes (pure): smoothed reward, elapsed and
ETA, one line per step for logs (stdout not a terminal), the live view's header."""

from __future__ import annotations

import math

SMOOTHING = 0.1  # the exponential moving average's weight of the newest step


def smoothed(values: list[float], alpha: float = SMOOTHING) -> list[float]:
    """Exponential moving average of `values` (the first value starts it)."""
    out: list[float] = []
    for v in values:
        out.append(v if not out else alpha * v + (1 - alpha) * out[-1])
    return out


def clock(seconds: float | None) -> str:
    """1:02:03, 4:05 or -- (unknown)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "--"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def eta(metrics: list[dict], total: int) -> float | None:
    """Seconds to step `total` at the pace of the steps so far (from the first step's
    end: start-up and warm-up are not the steady pace); None before two steps."""
    if len(metrics) < 2:
        return None
    pace = (metrics[-1]["time"] - metrics[0]["time"]) / (len(metrics) - 1)
    return max(total - metrics[-1]["step"], 0) * pace


def phase(metrics: list[dict], total: int, warmup_steps: int, warm: dict | None = None) -> str:
    """RL step n/N once steps come (the last one: the final weights being written);
    before, the supervised warm-up's n/N, loss and time left at its pace so far
    (`warm`: the trainer's warmup.json) or start-up."""
    if metrics:
        step = metrics[-1]["step"]
        if step >= total:
            return f"RL step {step}/{total} done: writing the final weights"
        return f"RL step {step}/{total}"
    if not warmup_steps:
        return "start-up"
    if not warm:
        return f"start-up, then warm-up ({warmup_steps} steps)"
    if warm["step"] >= warm["of"]:
        return f"warm-up done (loss {warm['loss']:.3f}), start-up of RL step 1"
    left = ""
    if warm.get("seconds") is not None and warm["step"]:
        left = f", {clock(warm['seconds'] / warm['step'] * (warm['of'] - warm['step']))} left"
    return f"warm-up {warm['step']}/{warm['of']} (loss {warm['loss']:.3f}{left})"


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


# the wide view's extra figures of a step: (column, metrics.jsonl key, format)
WIDE = (("clipped", "clip", ".3f"), ("IS w mean", "is_weight_mean", ".3f"),
        ("IS w max", "is_weight_max", ".2f"), ("capped", "is_capped", ".3f"),
        ("ESS", "is_ess", ".3f"), ("mismatch", "logp_mismatch_mean", ".1e"))


# an episodic job's columns (rollout.environment): mean model turns an episode, and the
# step's tool calls with those that failed (a tool's error or a call not parsed)
EPISODE = ("turns", "calls")


def episode_cells(m: dict) -> list[str]:
    """A step's EPISODE figures ("-" where the step has none)."""
    if m.get("turns_mean") is None:
        return ["-", "-"]
    failed = (m.get("tool_errors") or 0) + (m.get("malformed_calls") or 0)
    return [f"{m['turns_mean']:.1f}", f"{m.get('tool_calls', 0)}/{failed}"]


def wide_cells(m: dict) -> list[str]:
    """A step's WIDE figures, formatted ("-" where the step has none)."""
    return [_num(m.get(key), fmt) for _, key, fmt in WIDE]


def step_line(metrics: list[dict], total: int, elapsed: float, wide: bool = False) -> str:
    """One line about the newest step, for logs (`wide`: the off-policy figures too)."""
    m = metrics[-1]
    reward = smoothed([x["reward_mean"] for x in metrics])[-1]
    extra = "".join(f" · {name} {cell}" for (name, _, _), cell in zip(WIDE, wide_cells(m))
                    ) if wide else ""
    if m.get("turns_mean") is not None:
        turns, calls = episode_cells(m)
        extra = f" · turns {turns} · tool calls/failed {calls}" + extra
    return (f"step {m['step']}/{total} · reward {m['reward_mean']:.3f} (smoothed {reward:.3f})"
            f" · loss {_num(m.get('loss'), '.4f')} · kl {_num(m.get('kl'), '.4f')}"
            f" · staleness {m['staleness_mean']:.2f}/{m['staleness_max']}"
            f" · {m['tokens_per_second']:.0f} tok/s · Tgen {m['gen_seconds']:.2f}s"
            f" · Ttrain {m['train_seconds']:.2f}s{extra} · elapsed {clock(elapsed)}"
            f" · ETA {clock(eta(metrics, total))}")


def alerts(metrics: list[dict]) -> list[str]:
    """The steps' one-line alerts (the trainer's `off_policy_alert`), each distinct
    text once, at the first step that raised it."""
    seen: dict[str, int] = {}
    for m in metrics:
        text = m.get("off_policy_alert")
        if text and text not in seen:
            seen[text] = m["step"]
    return [f"step {step}: {text}" for text, step in seen.items()]


def header(name: str, metrics: list[dict], total: int, warmup_steps: int, elapsed: float,
           restarts: int = 0, warm: dict | None = None) -> str:
    """The live view's line above its table."""
    parts = [name, phase(metrics, total, warmup_steps, warm), f"elapsed {clock(elapsed)}",
             f"ETA {clock(eta(metrics, total))}"]
    if metrics:
        parts.append(f"reward (smoothed) {smoothed([x['reward_mean'] for x in metrics])[-1]:.3f}")
    if restarts:
        parts.append(f"restarts {restarts}")
    return " · ".join(parts)
