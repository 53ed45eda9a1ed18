"""A trainer step's figures: its metrics.jsonl line (`step_metrics`, with the
importance-weight and engine-mismatch figures and, ppo, the critic's), and
`Reporter`, rank 0's hand that sends them to the sinks (metrics.jsonl, Prometheus,
TensorBoard, W&B) and the job's to the controller (the operator's status)."""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..contract import LIVE_PROFILE_SKIP, LIVE_PROFILE_STEPS
from ..environments import episode_figures
from ..workflow.timing import (busy_seconds, generation_queue_seconds, generation_seconds,
                               profile_record, spread, training_seconds)
from .algorithms import OffPolicyStats
from .source import Sample, prompts_digest

log = logging.getLogger("rljob.trainer")


# the step's figures the controller keeps for the operator's status
CONTROLLER_FIGURES = ("gen_seconds", "train_seconds", "staleness_mean", "staleness_max",
                      "tokens_per_second", "samples_per_second", "reward_mean")


def critic_metrics(samples: list[Sample], critic) -> dict:
    """A step's critic figures: the critic versions that scored its samples, and the
    critic's latest update (its version, value loss, clipped share, mean value)."""
    versions = [s.critic_version for s in samples]
    last = critic.history[max(critic.history)] if critic.history else {}
    return {"scored_by_critic": [min(versions), max(versions)],
            "critic_version": last.get("step", 0), "value_loss": last.get("value_loss"),
            "value_clip": last.get("value_clip"), "values_mean": last.get("values_mean")}


# mean |rollout − trainer log-prob| of fresh tokens above which a step says so: the
# same weights under two engines differ by ~1e-6 nats in float32 and ~1e-2 in
# bfloat16; a tenth of a nat on average is a different distribution (a tokenizer,
# a chat template, a weight sync or a sampling setting that does not match)
MISMATCH_ALERT = 0.1


def off_policy_figures(stats: OffPolicyStats) -> dict:
    """A step's importance-weight and mismatch figures; with `off_policy_alert`, one
    line, when the engine mismatch is far out of line (also logged)."""
    raw = stats.figures()
    figures = {k: (v if v is None or math.isfinite(v) else None) for k, v in raw.items()}
    alert = mismatch_alert(raw["logp_mismatch_mean"])
    if alert:
        log.warning(alert)
        figures["off_policy_alert"] = alert
    return figures


def mismatch_alert(mean: float | None) -> str | None:
    """The line a step's engine mismatch (mean |Δ log-prob| on fresh tokens) earns, or
    None when it is in line (pure)."""
    if mean is None or mean <= MISMATCH_ALERT:
        return None
    return (f"rollout and trainer log-probs of the same tokens under the same weights "
            f"differ by {mean:.3g} nats on average (in line: below {MISMATCH_ALERT}): the "
            f"rollouts sample from another distribution than the trainer scores; check the "
            f"tokenizer, the weight sync and the rollout engine's sampling settings")


def token_staleness(t, samples) -> dict[int, int]:
    """Step t's generated tokens by staleness, each token counted with the version
    that generated it (pure). A sample's change points at a time: token by token, 256
    samples took 2.0 ms of the reporter's thread at 128 tokens each and 13 ms at
    1024, now 0.2 ms at either."""
    from ..workflow.versions import version_counts

    out: dict[int, int] = {}
    for s in samples:
        for v, n in version_counts(s.changes, len(s.response_ids)).items():
            out[t - v] = out.get(t - v, 0) + n
    return dict(sorted(out.items()))


def kept_cache_tokens(samples) -> int:
    """The generated tokens that attended to a cache an older version computed: under
    interruptCache keep, an interrupted sample's tokens from its first change on (pure)."""
    return sum(len(s.response_ids) - s.changes[1][0] for s in samples
               if len(s.changes) > 1)


def step_metrics(t, samples, train_spans, wall, sums, released: float = 0.0,
                 kept_cache: bool = False) -> dict:
    """A metrics.jsonl line of step t (Tgen and Ttrain: workflow/timing.py). `released`:
    when the weights that release step t were published; its prompts, put before
    (`released_at`), wait in the queue from then on. `kept_cache`: updates kept the
    interrupted samples' cache (workflow.interruptCache keep)."""
    versions = [t - s.version for s in samples]
    generating = [(s.started_at, s.finished_at) for s in samples]
    gen_seconds = generation_seconds(generating)
    tokens = sum(len(s.response_ids) for s in samples)
    return {
        "step": t + 1,
        "time": time.time(),
        "samples": len(samples),
        "versions": sorted({s.version for s in samples}),
        "reward_mean": float(np.mean([s.reward for s in samples])),
        "staleness_mean": float(np.mean(versions)),
        # the oldest token's (an interrupted sample's first)
        "staleness_max": int(max(versions)),
        # per generated token (weightUpdate interrupt: a token of a sample an update
        # interrupted counts the staleness of the weights that made it)
        "staleness_tokens": (by_token := token_staleness(t, samples)),
        "staleness_token_mean": (sum(k * n for k, n in by_token.items())
                                 / max(1, sum(by_token.values()))),
        "interrupted": sum(1 for s in samples if len(s.changes) > 1),
        # interruptCache keep: tokens whose context holds an older version's KV cache
        "kept_cache_tokens": kept_cache_tokens(samples) if kept_cache else 0,
        "gen_seconds": gen_seconds,
        "gen_queue_seconds": generation_queue_seconds(
            [max(s.released_at, released) for s in samples], generating),
        "train_seconds": training_seconds(train_spans),
        "step_seconds": wall,
        "tokens": tokens,
        "tokens_per_second": tokens / gen_seconds if gen_seconds > 0 else 0.0,
        "samples_per_second": len(samples) / wall if wall > 0 else 0.0,
        "response_length": tokens / len(samples),
        # the step's workload (a profile's input, planner/live.py): every response's
        # length (at most 256 of them, evenly over the sorted lengths) and the prompts'
        "response_lengths": spread(sorted(len(s.response_ids) for s in samples), 256),
        "prompt_tokens": float(np.mean([len(s.prompt_ids) for s in samples])),
        # the rollout engine calls that generated them (at most 64) and the tokens the
        # trainer computed on in train_seconds: a live profile's latency model
        # (planner/live.py `profile_from_metrics`)
        "gen_calls": spread([c for s in samples for c in s.gen_calls], 64),
        "train_tokens": sum(len(s.prompt_ids) + len(s.response_ids) for s in samples),
        "prompts": prompts_digest(s.prompt_ids for s in sorted(samples, key=lambda s: s.slot)),
        **{k: (v if math.isfinite(v) else None) for k, v in sums.items()},
        # episodes (rollout.environment): none for single-turn samples
        **episode_figures([s.episode for s in samples if s.episode]),
        **scoring_figures(samples),
    }


def scoring_figures(samples) -> dict:
    """The reward task's figures of a step (reward.url, reward.model; none where the
    rollouts scored): the rule's mean score (reward.name, whether combined or only
    watched), the samples whose scoring failed (a call that failed for good: they
    scored failureScore), and the reward replicas' busy seconds (the union of their
    batches' spans)."""
    scored = [s.scoring for s in samples if s.scoring is not None]
    if not scored:
        return {}
    return {"rule_reward_mean": float(np.mean([x[0] for x in scored])),
            "reward_failed": sum(1 for x in scored if x[1]),
            "reward_seconds": busy_seconds([(x[2], x[3]) for x in scored])}


class Reporter:
    """Rank 0's figures of each step, to the sinks; those the controller keeps (the
    operator's status, the live profile), to the controller. `submit` makes and
    sends them from a thread of the reporter's own, in step order, while the next
    step runs; a report that failed raises from a later `submit` or `flush` (`close`
    logs it). `flush` waits for every step's: a checkpoint comes after its steps'
    figures, so a trainer restarted from it has every earlier step's line."""

    def __init__(self, tq, name: str, sinks):
        self.tq, self.name, self.sinks = tq, name, sinks
        # the live profile's window (rljob/contract.py; the operator's autoscaler waits
        # for its first record): this life's steps after its first LIVE_PROFILE_SKIP
        self.recent: deque[dict] = deque(maxlen=LIVE_PROFILE_STEPS)
        self.reported = 0
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="rljob-report")
        self._sent: list[Future] = []

    def report(self, m: dict, version: int) -> None:
        self.reported += 1
        if self.reported > LIVE_PROFILE_SKIP:  # start-up (compilation, first weights) aside
            self.recent.append(m)
        profile = json.dumps(profile_record(list(self.recent))) if self.recent else ""
        self.tq.report_metrics(step=version, source=self.name, profile=profile,
                               **{k: m[k] for k in CONTROLLER_FIGURES})
        self.sinks.write(m, version)

    def submit(self, figures: Callable[[], tuple[dict, int]],
               after: Callable[[], object] | None = None) -> None:
        """`report(*figures())` in the reporter's thread, once `after()` returned."""
        done = [f for f in self._sent if f.done()]
        self._sent = [f for f in self._sent if not f.done()]
        for f in done:
            f.result()  # a failed report raises here

        def send() -> None:
            if after is not None:
                after()
            self.report(*figures())

        self._sent.append(self._thread.submit(send))

    def flush(self) -> None:
        """Wait until every submitted step's figures are out (the first failure
        raises)."""
        sent, self._sent = self._sent, []
        for f in sent:
            f.result()

    def close(self) -> None:
        """Send what is left; a report that fails now is logged (the worker is
        going, whatever it goes for)."""
        try:
            for f in self._sent:
                try:
                    f.result()
                except Exception as exc:  # noqa: BLE001 - stopping: report, do not mask
                    log.warning("a step's figures were not reported: %s", exc)
        finally:
            self._thread.shutdown()
            self.sinks.close()
