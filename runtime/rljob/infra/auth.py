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
import grpc

from ..contract import TOKEN_ENV
from . import tls

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
class _Presenting:
    """A multi-callable of a channel whose calls present the token (its metadata first,
    then the caller's). What grpc's client interceptors do, at the cost of one Python
    call: an intercepted channel took 45 us more of the client's CPU a call, 22 % of a
    controller call's."""

    __slots__ = ("_inner", "_pair")

    def __init__(self, inner, pair):
        self._inner, self._pair = inner, pair

    def _metadata(self, metadata):
        return (self._pair,) if not metadata else (self._pair, *metadata)

    def __call__(self, request, timeout=None, metadata=None, **kwargs):
        return self._inner(request, timeout=timeout, metadata=self._metadata(metadata), **kwargs)

    def future(self, request, timeout=None, metadata=None, **kwargs):
        return self._inner.future(request, timeout=timeout, metadata=self._metadata(metadata),
                                  **kwargs)

    def with_call(self, request, timeout=None, metadata=None, **kwargs):
        return self._inner.with_call(request, timeout=timeout,
                                     metadata=self._metadata(metadata), **kwargs)


class _TokenChannel(grpc.Channel):
    """A channel every call of which presents the job's token."""

    def __init__(self, channel: grpc.Channel, token: str):
        self._channel = channel
        self._pair = (METADATA_KEY, SCHEME + token)

    def unary_unary(self, method, *args, **kwargs):
        return _Presenting(self._channel.unary_unary(method, *args, **kwargs), self._pair)

    def unary_stream(self, method, *args, **kwargs):
        return _Presenting(self._channel.unary_stream(method, *args, **kwargs), self._pair)

    def stream_unary(self, method, *args, **kwargs):
        return _Presenting(self._channel.stream_unary(method, *args, **kwargs), self._pair)

    def stream_stream(self, method, *args, **kwargs):
        return _Presenting(self._channel.stream_stream(method, *args, **kwargs), self._pair)

    def subscribe(self, callback, try_to_connect=False):
        self._channel.subscribe(callback, try_to_connect=try_to_connect)

    def unsubscribe(self, callback):
        self._channel.unsubscribe(callback)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._channel.close()
        return False


def channel(address: str, options=None, token: str | None = None,
            ca: bytes | None = None) -> grpc.Channel:
    """A channel to one of the job's servers whose calls present the job's token
    (`token`, else this process's; none: no token), over TLS that trusts the job's CA
    (`ca`, else this process's: infra/tls.py; none: plain text)."""
    ca = ca if ca is not None else tls.ca_from_env()
    inner = (tls.secure_channel(address, ca, options) if ca
             else grpc.insecure_channel(address, options=options))
    token = token_from_env(token)
    return _TokenChannel(inner, token) if token else inner


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
