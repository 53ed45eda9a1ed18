"""reward.url's client against a real HTTP server on loopback: retries, time limits,
the concurrency cap, answers it cannot read; `rljob reward serve`'s server; the
combination of a rule and a scorer."""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rljob.api.spec import RemoteRewardSpec, RewardSpec
from rljob.reward import get_reward
from rljob.reward.combine import asks, combine
from rljob.reward.remote import RemoteScorer, backoff, retry_after
from rljob.reward.server import make_server, parse_request


class Service:
    """A scoring service whose answers a test scripts: `plan` maps a response text to
    a list of behaviours, one per call (the last repeats): an int status (200 scores
    len(response)), "hang", "close", "text", "nokey", "string"."""

    def __init__(self, plan=None, delay: float = 0.0):
        self.plan, self.delay = dict(plan or {}), delay
        self.calls: list[dict] = []
        self.headers: list[str] = []
        self.inflight = self.peak = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with service.lock:
                    n = sum(1 for c in service.calls if c["response"] == body["response"])
                    service.calls.append(body)
                    service.headers.append(self.headers.get("Authorization", ""))
                    service.inflight += 1
                    service.peak = max(service.peak, service.inflight)
                try:
                    steps = service.plan.get(body["response"], [200])
                    what = steps[min(n, len(steps) - 1)]
                    time.sleep(service.delay)
                    self.act(what, body)
                finally:
                    with service.lock:
                        service.inflight -= 1

            def act(self, what, body):
                if what == "hang":
                    service.release.wait(30)
                    return
                if what == "close":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                doc = {"text": b"not json", "nokey": b'{"value": 1}',
                       "string": b'{"score": "high"}'}.get(what)
                status = 200 if isinstance(what, str) else what
                if doc is None:
                    doc = json.dumps({"score": float(len(body["response"])),
                                      "points": 7.0}).encode()
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "0.3")
                self.send_header("Content-Length", str(len(doc)))
                self.end_headers()
                self.wfile.write(doc)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service():
    made = []

    def make(plan=None, delay=0.0):
        made.append(Service(plan, delay))
        return made[-1]

    yield make
    for s in made:
        s.close()


def scorer(url, **kw):
    kw.setdefault("backoff_seconds", 0.01)
    return RemoteScorer(RemoteRewardSpec(endpoint=url, **kw), api_key="", seed=0)


def ask(s, *responses, **row):
    return s.score([{"prompt": "p", "response": r, "answer": "a", **row} for r in responses])


def test_a_score_per_sample_with_its_row_and_the_api_key(service):
    svc = service()
    s = RemoteScorer(RemoteRewardSpec(endpoint=svc.url), api_key="k3y", seed=0)
    try:
        got = ask(s, "ab", "abcd", source="gsm8k")
        assert [g.score for g in got] == [2.0, 4.0] and not any(g.error for g in got)
        # the two calls went together: in either order
        assert {"prompt": "p", "response": "ab", "answer": "a", "source": "gsm8k"} in svc.calls
        assert svc.headers == ["Bearer k3y"] * 2
    finally:
        s.close()
    other = scorer(svc.url, score_key="points")  # scoreKey; no key: no header
    try:
        assert ask(other, "x")[0].score == 7.0 and svc.headers[-1] == ""
    finally:
        other.close()


def test_a_5xx_is_tried_again_and_a_4xx_is_not(service):
    svc = service({"flaky": [503, 500, 200], "bad": [400], "busy": [429, 200]})
    s = scorer(svc.url, max_retries=3)
    try:
        t0 = time.monotonic()
        flaky, bad, busy = ask(s, "flaky", "bad", "busy")
        assert (flaky.score, flaky.error) == (5.0, "")
        assert (busy.score, busy.error) == (4.0, "")
        assert time.monotonic() - t0 >= 0.3  # the 429's Retry-After
        assert bad.score == 0.0 and bad.error.startswith("reward.url: HTTP 400")
        count = {r: sum(c["response"] == r for c in svc.calls) for r in ("flaky", "bad", "busy")}
        assert count == {"flaky": 3, "bad": 1, "busy": 2}
        stats = s.take_stats()
        assert (stats.calls, stats.retries, stats.failures) == (6, 3, 1)
    finally:
        s.close()


def test_a_service_that_fails_for_good_scores_the_failure_score(service):
    svc = service({"down": [502], "cut": ["close"]})
    s = scorer(svc.url, max_retries=2, failure_score=-1.0)
    try:
        down, cut = ask(s, "down", "cut")
        assert down.score == cut.score == -1.0
        assert down.error == "reward.url: HTTP 502 Bad Gateway (3 attempts)"
        assert "(3 attempts)" in cut.error
        assert sum(c["response"] == "cut" for c in svc.calls) == 3
    finally:
        s.close()
    nobody = scorer(svc.url.replace(str(svc.server.server_address[1]), "1"), max_retries=1)
    try:
        refused = ask(nobody, "x")[0]
        assert refused.score == 0.0 and "ConnectError" in refused.error
    finally:
        nobody.close()


def test_a_hanging_service_costs_its_time_limits_and_no_more(service):
    svc = service({"slow": ["hang"]})
    s = scorer(svc.url, timeout_seconds=0.4, max_retries=1, backoff_seconds=0.1)
    try:
        t0 = time.monotonic()
        slow, quick = ask(s, "slow", "quick")
        took = time.monotonic() - t0
        # two attempts of 0.4 s, a wait of 0.1-0.2 s between them
        assert 0.9 <= took < 1.0 + 1.0, took
        assert slow.error == "reward.url: no answer within 0.4 s (2 attempts)"
        assert (quick.score, quick.error) == (5.0, "")
    finally:
        s.close()


def test_answers_without_a_number_fail_at_once(service):
    svc = service({"t": ["text"], "k": ["nokey"], "s": ["string"]})
    s = scorer(svc.url, max_retries=3)
    try:
        t, k, s_ = ask(s, "t", "k", "s")
        assert "not JSON" in t.error and "has no 'score' (reward.url.scoreKey)" in k.error
        assert "not a number" in s_.error
        assert len(svc.calls) == 3  # none tried again
    finally:
        s.close()


def test_no_more_calls_in_flight_than_the_concurrency(service):
    svc = service(delay=0.1)
    s = scorer(svc.url, concurrency=3)
    try:
        t0 = time.monotonic()
        got = ask(s, *[f"r{i}" for i in range(12)])
        assert [g.score for g in got] == [float(len(f"r{i}")) for i in range(12)]
        assert svc.peak == 3
        assert time.monotonic() - t0 >= 0.4  # 12 calls of 0.1 s, 3 at a time
    finally:
        s.close()


def test_backoff_doubles_up_to_its_cap_with_jitter_and_retry_after_is_read():
    rng = random.Random(1)
    waits = [backoff(a, 1.0, rng) for a in (1, 2, 3, 7)]
    for got, base in zip(waits, (1.0, 2.0, 4.0, 30.0)):
        assert base <= got <= 2 * base
    assert retry_after({"retry-after": "2"}) == 2.0
    assert retry_after({"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}) == 0.0
    assert retry_after({"retry-after": "600"}) == 30.0 and retry_after({}) == 0.0


def test_the_served_reward_answers_the_client():
    server = make_server(get_reward("arith_partial"), key="s3cret")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    good = RemoteScorer(RemoteRewardSpec(endpoint=url), api_key="s3cret", seed=0)
    bad = RemoteScorer(RemoteRewardSpec(endpoint=url, max_retries=0), api_key="nope", seed=0)
    try:
        rows = [{"prompt": "12+30=", "response": r, "answer": "42"} for r in ("42", "41", "x")]
        fn = get_reward("arith_partial")
        assert [g.score for g in good.score(rows)] == [fn(r["prompt"], r["response"], "42")
                                                      for r in rows]
        refused = bad.score(rows[:1])[0]
        assert refused.error.startswith("reward.url: HTTP 401")
    finally:
        good.close()
        bad.close()
        server.shutdown()
        server.server_close()


def test_a_request_the_server_cannot_read_says_why():
    assert parse_request(b'{"prompt": "p", "response": "r", "answer": "a", "k": 1}') == \
        ("p", "r", "a", {"k": 1})
    for body, why in ((b"[", "not JSON"), (b"[]", "not a JSON object"),
                      (b'{"prompt": "p", "response": 3, "answer": "a"}', "'response'")):
        with pytest.raises(ValueError, match=why):
            parse_request(body)


def test_the_rule_and_the_score_combine_as_the_spec_says():
    url = {"endpoint": "http://rm:8000/score"}
    alone = RewardSpec(url=url)
    weighted = RewardSpec(url=url, combine="weighted", rule_weight=0.5, score_weight=2.0)
    gate = RewardSpec(url=url, combine="gate", gate_threshold=0.5)
    assert combine(alone, 1.0, 0.25) == 0.25 and asks(alone, -5.0)
    assert combine(weighted, 1.0, 0.25) == 1.0 and asks(weighted, 0.0)
    assert not asks(gate, 0.4) and combine(gate, 0.4, None) == 0.4
    assert asks(gate, 0.5) and combine(gate, 0.5, 0.9) == 0.9


def test_combine_needs_a_scorer_and_the_endpoint_a_url():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="set reward.url or reward.model, or combine none"):
        RewardSpec(combine="gate")
    with pytest.raises(ValidationError, match="endpoint"):
        RewardSpec(url={"endpoint": "ftp://rm/score"})
    assert not RewardSpec().streamed and RewardSpec(url={"endpoint": "https://rm/x"}).streamed
