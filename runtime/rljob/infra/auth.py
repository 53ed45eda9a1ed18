"""The job's token on its gRPC endpoints: every server of a job (the TransferQueue
controller and its storage service, the trainer's weight server) answers only callers
that present the job's token, and every client of the job presents it.

One secret per job, made where the job starts (the operator's Secret, `rljob run`'s
environment) and handed to each of its processes in `TOKEN_ENV`; a caller presents it
as gRPC metadata (`authorization: Bearer TOKEN`), checked in constant time by a server
interceptor before the method runs, so a refused call reads and changes nothing. A
refusal is UNAUTHENTICATED to the caller and one line in the server's log naming the
caller's address, the method and the reason (never the token). The health service
stays open (probes carry no token and learn nothing). A process without `TOKEN_ENV`
(a library user's, a unit test's) serves and calls without a token.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from collections import namedtuple

import grpc

from ..contract import TOKEN_ENV

METADATA_KEY = "authorization"
SCHEME = "Bearer "
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)  # served to anyone

log = logging.getLogger("rljob.auth")


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_from_env(token: str | None = None) -> str | None:
    """`token` if given, else this process's job token (None: none)."""
    return token if token is not None else (os.environ.get(TOKEN_ENV) or None)


def refusal(metadata, token: str) -> str | None:
    """Why a call with `metadata` ((key, value) pairs) may not be served by a server of
    `token`; None: it may (pure)."""
    presented = [v for k, v in (metadata or ()) if k == METADATA_KEY]
    if not presented:
        return "no job token"
    if len(presented) > 1:
        return "more than one token"
    value = presented[0] if isinstance(presented[0], str) else presented[0].decode(
        errors="replace")
    if not value.startswith(SCHEME):
        return "a token not of the Bearer scheme"
    if not hmac.compare_digest(value[len(SCHEME):].encode(), token.encode()):
        return "a wrong job token"
    return None


# ---- clients ----------------------------------------------------------------------
_Details = namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                   "wait_for_ready", "compression"))


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
              grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the token to every call of a channel."""

    def __init__(self, token: str):
        self._pair = (METADATA_KEY, SCHEME + token)

    def _with_token(self, d) -> _Details:
        return _Details(d.method, d.timeout, [*(d.metadata or ()), self._pair],
                        d.credentials, d.wait_for_ready, d.compression)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)


def channel(address: str, options=None, token: str | None = None) -> grpc.Channel:
    """A channel to one of the job's servers whose calls present the job's token
    (`token`, else this process's; none: a plain channel)."""
    plain = grpc.insecure_channel(address, options=options)
    token = token_from_env(token)
    return grpc.intercept_channel(plain, _Bearer(token)) if token else plain


# ---- servers ----------------------------------------------------------------------
def _refused(handler, method: str, reason: str, is_async: bool):
    """A handler of `handler`'s kind that refuses the call and logs who was refused."""
    def note(context) -> None:
        log.warning("refused %s from %s: %s", method, context.peer(), reason)

    if is_async:
        async def behavior(_request, context):
            note(context)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
    else:
        def behavior(_request, context):
            note(context)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

    if handler.request_streaming and handler.response_streaming:
        make = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        make = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        make = grpc.unary_stream_rpc_method_handler
    else:
        make = grpc.unary_unary_rpc_method_handler
    return make(behavior, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


def _verdict(details, token: str) -> str | None:
    if details.method.startswith(OPEN_PREFIXES):
        return None
    return refusal(details.invocation_metadata, token)


class TokenCheck(grpc.ServerInterceptor):
    """A (threaded) server's check of the job's token."""

    def __init__(self, token: str):
        self._token = token

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        reason = _verdict(details, self._token)
        if handler is None or reason is None:
            return handler
        return _refused(handler, details.method, reason, is_async=False)


class AsyncTokenCheck(grpc.aio.ServerInterceptor):
    """An asyncio server's check of the job's token."""

    def __init__(self, token: str):
        self._token = token

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        reason = _verdict(details, self._token)
        if handler is None or reason is None:
            return handler
        return _refused(handler, details.method, reason, is_async=True)


def server_interceptors(token: str | None = None, is_async: bool = False) -> list:
    """The interceptors of a server of the job (`token`, else this process's job
    token; none: no check, with a warning)."""
    token = token_from_env(token)
    if not token:
        log.warning("no job token (%s): this server answers any caller", TOKEN_ENV)
        return []
    return [AsyncTokenCheck(token) if is_async else TokenCheck(token)]
