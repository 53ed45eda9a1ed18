"""Run in a pod that is not one of the job's (`python -c "$(cat outsider.py)" TARGETS`):
tries each endpoint of TARGETS (a JSON list of {name, kind, host, port}) as a
stranger, with no credential, and prints one JSON object: each endpoint's outcome.

  timeout         the connection was never answered (a NetworkPolicy dropped it)
  closed: ...     refused at the TCP level
  grpc: CODE      connected; the gRPC call ended with CODE (UNAUTHENTICATED: the token)
  redis: ...      connected; Redis's answer to a GET (NOAUTH: the ACL user)
  http: STATUS    connected; the HTTP status of GET /metrics

A server that speaks TLS (transferQueue.tls) refuses plain text; the stranger then
speaks TLS as one who trusts any certificate would, and the outcome says so
("grpc over TLS: CODE", "redis over TLS: ..."): what the credentials alone refuse.
"""

import json
import select
import socket
import ssl
import sys
import threading
import urllib.request

TIMEOUT = 4.0


def _insecure_tls(host: str, port: int, alpn: list[str]) -> ssl.SSLSocket:
    """A TLS connection that checks no certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_alpn_protocols(alpn)
    return ctx.wrap_socket(socket.create_connection((host, port), timeout=TIMEOUT))


def _tunnel(host: str, port: int) -> int:
    """A local plain-text port whose one connection goes on to host:port over TLS
    (gRPC's h2): a gRPC client with no trust in the server's CA."""
    listener = socket.create_server(("127.0.0.1", 0))

    def pump() -> None:
        conn, _ = listener.accept()
        remote = _insecure_tls(host, port, ["h2"])
        with conn, remote:
            while True:
                ready = [remote] if remote.pending() else \
                    select.select([conn, remote], [], [], 2 * TIMEOUT)[0]
                if not ready:
                    return
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (remote if s is conn else conn).sendall(data)

    threading.Thread(target=pump, daemon=True).start()
    return listener.getsockname()[1]


def reach(host: str, port: int) -> str | None:
    try:
        socket.create_connection((host, port), timeout=TIMEOUT).close()
        return None
    except socket.timeout:
        return "timeout"
    except OSError as exc:
        return f"closed: {exc}"


def speak(kind: str, host: str, port: int) -> str:
    if kind == "redis":  # GET x in Redis's protocol, as any client first sends a command
        with socket.create_connection((host, port), timeout=TIMEOUT) as s:
            s.sendall(b"*2\r\n$3\r\nGET\r\n$1\r\nx\r\n")
            try:
                said = s.recv(512).decode(errors="replace").strip()
            except OSError:  # a TLS server drops plain text
                said = ""
        if said:
            return f"redis: {said}"
        with _insecure_tls(host, port, []) as s:
            s.sendall(b"*2\r\n$3\r\nGET\r\n$1\r\nx\r\n")
            return f"redis over TLS: {s.recv(512).decode(errors='replace').strip()}"
    if kind == "http":
        try:
            return f"http: {urllib.request.urlopen(f'http://{host}:{port}/metrics', timeout=TIMEOUT).status}"
        except OSError as exc:
            return f"http: {exc}"
    import grpc  # kind: a gRPC method's full name, called with an empty request

    def call(address: str) -> str:
        with grpc.insecure_channel(address) as channel:
            method = channel.unary_unary(kind, request_serializer=lambda m: m,
                                         response_deserializer=lambda m: m)
            try:
                method(b"", timeout=TIMEOUT)
                return "OK"
            except grpc.RpcError as exc:
                return exc.code().name

    plain = call(f"{host}:{port}")
    if plain != "UNAVAILABLE":
        return f"grpc: {plain}"
    return f"grpc over TLS: {call(f'127.0.0.1:{_tunnel(host, port)}')}"


def main() -> None:
    out = {}
    for t in json.loads(sys.argv[1]):
        out[t["name"]] = reach(t["host"], t["port"]) or speak(t["kind"], t["host"], t["port"])
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
