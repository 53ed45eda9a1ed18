"""`rljob reward serve`: a reward function served on reward.url's protocol
(reward/remote.py), for a service of one's own or a job's test: a POST of
{"prompt", "response", "answer", row keys...} answered {"score": x} (and
"error" where the function failed, which scored 0.0).

With RLJOB_REWARD_API_KEY set, a call without 'Authorization: Bearer KEY' is
answered 401."""

from __future__ import annotations

import hmac
import json
import logging
import os
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import score_all
from .registry import RewardFn
from .remote import API_KEY_ENV

log = logging.getLogger("rljob.reward.server")
MAX_BODY = 16 << 20  # bytes of one request


def parse_request(body: bytes) -> tuple[str, str, str, dict]:
    """(prompt, response, answer, the row's other keys) of a request body (pure);
    ValueError says what is wrong with it."""
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise ValueError(f"the body is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("the body is not a JSON object")
    for key in ("prompt", "response", "answer"):
        if not isinstance(doc.get(key), str):
            raise ValueError(f"{key!r} must be a string")
    row = {k: v for k, v in doc.items() if k not in ("prompt", "response", "answer")}
    return doc["prompt"], doc["response"], doc["answer"], row


def make_server(fn: RewardFn, host: str = "127.0.0.1", port: int = 0,
                key: str | None = None) -> ThreadingHTTPServer:
    """A threaded server scoring with `fn` (`serve_forever` it; `server_address`
    has its port). `key`: the bearer token calls must carry (None: any caller)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the client's pool reuses connections

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            if key and not hmac.compare_digest(self.headers.get("Authorization", ""),
                                               f"Bearer {key}"):
                return self._answer(HTTPStatus.UNAUTHORIZED, {"error": "bad or no API key"})
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_BODY:
                return self._answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                    {"error": f"over {MAX_BODY} bytes"})
            try:
                prompt, response, answer, row = parse_request(self.rfile.read(size))
            except ValueError as exc:
                return self._answer(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            got = score_all(fn, [prompt], [response], [answer], [row])[0]
            self._answer(HTTPStatus.OK, {"score": got.score, **({"error": got.error}
                                                                  if got.error else {})})

        def _answer(self, status: HTTPStatus, doc: dict) -> None:
            body = json.dumps(doc).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the caller went (a time
                self.close_connection = True  # limit, a reward replica killed)
                log.debug("%s went before its answer", self.client_address[0])

        def log_message(self, fmt: str, *args) -> None:
            log.debug(fmt, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve(fn: RewardFn, host: str, port: int) -> None:
    """Serve until interrupted; the key, where one is set, from RLJOB_REWARD_API_KEY."""
    server = make_server(fn, host, port, os.environ.get(API_KEY_ENV) or None)
    log.info("scoring on http://%s:%d/ (%s)", *server.server_address[:2],
             "an API key required" if os.environ.get(API_KEY_ENV) else "no API key")
    try:
        server.serve_forever()
    finally:
        server.server_close()
