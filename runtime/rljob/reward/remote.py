"""A scoring service the user runs (reward.url), called for each sample.

The protocol: a POST of a JSON object {"prompt", "response", "answer", and the
dataset row's other keys} to the endpoint; the answer is a JSON object whose
`scoreKey` field (default "score") holds the score, a number. `rljob reward serve`
serves any reward function this way (reward/server.py).

Each call has a wall-clock limit (timeoutSeconds: connecting, sending and reading
together), and is tried again after a failure another try may mend (no
connection, the limit, a 5xx or 429 answer) up to maxRetries times, waiting
backoffSeconds, doubled each time (30 s at most), with as much again at random
(a 429's Retry-After, where longer, within the same 30 s). An answer that is
another 4xx, not JSON, or without a number is not tried again: the service said
what it will say. A call that failed for good scores failureScore and keeps its
error, so a service that hangs or fails costs the job at most its limits, never a
stall. At most `concurrency` calls are in flight (one asyncio loop per scorer, on a
thread of its own, and httpx2's connection pool of that size)."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import Scored, _number, _one_line

log = logging.getLogger("rljob.reward")

API_KEY_ENV = "RLJOB_REWARD_API_KEY"  # the service's key: 'Authorization: Bearer KEY'
BACKOFF_CAP_S = 30.0
RETRIED = (429, 500, 502, 503, 504)  # statuses another try may mend (and every 5xx)


@dataclass
class CallStats:
    """What a scorer's calls did (the worker's metrics read and reset them)."""

    calls: int = 0
    retries: int = 0
    failures: int = 0
    seconds: list[float] | None = None  # each attempt's wall time

    def __post_init__(self):
        self.seconds = [] if self.seconds is None else self.seconds


def backoff(attempt: int, base: float, rng: random.Random) -> float:
    """The wait before retry `attempt` (1, 2, ...): base·2^(attempt−1), 30 s at
    most, plus up to as much again at random (pure but for `rng`)."""
    wait = min(base * 2 ** (attempt - 1), BACKOFF_CAP_S)
    return wait + rng.uniform(0, wait)


def retry_after(headers: Mapping[str, str]) -> float:
    """A 429's Retry-After in seconds (0 when absent or a date), 30 s at most."""
    try:
        return min(max(float(headers.get("retry-after", "0")), 0.0), BACKOFF_CAP_S)
    except ValueError:
        return 0.0


class _Retry(Exception):
    """A failure another try may mend; `after`: the least wait the service asked for."""

    def __init__(self, message: str, after: float = 0.0):
        super().__init__(message)
        self.after = after


class _Final(Exception):
    """A failure no retry mends."""


class RemoteScorer:
    """reward.url's client: `score(payloads)` from any thread, each payload a JSON
    object for one sample; a Scored per payload, in order."""

    def __init__(self, spec, api_key: str | None = None, seed: int | None = None):
        self.spec = spec
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.stats = CallStats()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="rljob-reward-calls")
        self._thread.start()
        self._client = self._run(self._open())

    async def _open(self):
        import httpx2

        self._gate = asyncio.Semaphore(self.spec.concurrency)
        return httpx2.AsyncClient(
            timeout=httpx2.Timeout(self.spec.timeout_seconds),
            limits=httpx2.Limits(max_connections=self.spec.concurrency,
                                 max_keepalive_connections=self.spec.concurrency))

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def score(self, payloads: Sequence[Mapping]) -> list[Scored]:
        """Every payload's score, the calls `concurrency` at a time."""
        return self._run(self._all(payloads))

    async def _all(self, payloads: Sequence[Mapping]) -> list[Scored]:
        return list(await asyncio.gather(*(self._one(p) for p in payloads)))

    async def _one(self, payload: Mapping) -> Scored:
        spec = self.spec
        async with self._gate:
            error, after = "", 0.0
            for attempt in range(spec.max_retries + 1):
                if attempt:
                    self._count(retries=1)
                    await asyncio.sleep(max(backoff(attempt, spec.backoff_seconds, self._rng),
                                            after))
                try:
                    return await self._attempt(payload)
                except _Retry as exc:
                    error, after = str(exc), exc.after
                except _Final as exc:
                    return self._failed(str(exc))
            tries = spec.max_retries + 1
            return self._failed(f"{error} ({tries} attempt{'s' * (tries > 1)})")

    async def _attempt(self, payload: Mapping) -> Scored:
        import httpx2

        t0 = time.monotonic()
        try:
            answer = await asyncio.wait_for(
                self._client.post(self.spec.endpoint, json=dict(payload), headers=self.headers),
                self.spec.timeout_seconds)
        except (asyncio.TimeoutError, httpx2.TimeoutException):
            raise _Retry(f"no answer within {self.spec.timeout_seconds:g} s") from None
        except httpx2.TransportError as exc:
            raise _Retry(_one_line(exc)) from None
        finally:
            self._count(calls=1, seconds=time.monotonic() - t0)
        status = answer.status_code
        if status in RETRIED or status >= 500:
            raise _Retry(f"HTTP {status} {answer.reason_phrase}".rstrip(),
                         retry_after(answer.headers) if status == 429 else 0.0)
        if status >= 400:
            raise _Final(f"HTTP {status} {answer.reason_phrase}: {answer.text[:200]}".rstrip())
        return Scored(self._value(answer))

    def _value(self, answer) -> float:
        key = self.spec.score_key
        try:
            body = answer.json()
        except ValueError:
            raise _Final(f"the answer is not JSON: {answer.text[:80]!r}") from None
        if not isinstance(body, dict) or key not in body:
            raise _Final(f"the answer has no {key!r} (reward.url.scoreKey): {answer.text[:80]!r}")
        try:
            return _number(body[key])
        except TypeError as exc:
            raise _Final(str(exc)) from None

    def _failed(self, error: str) -> Scored:
        self._count(failures=1)
        return Scored(self.spec.failure_score, f"reward.url: {error}")

    def _count(self, calls: int = 0, retries: int = 0, failures: int = 0,
               seconds: float | None = None) -> None:
        with self._lock:
            self.stats.calls += calls
            self.stats.retries += retries
            self.stats.failures += failures
            if seconds is not None:
                self.stats.seconds.append(seconds)

    def take_stats(self) -> CallStats:
        """What the calls did since the last take."""
        with self._lock:
            stats, self.stats = self.stats, CallStats()
        return stats

    def close(self) -> None:
        try:
            self._run(self._client.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()

