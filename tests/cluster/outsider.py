"""Run in a pod that is not one of the job's (`python -c "$(cat outsider.py)" TARGETS`):
tries each endpoint of TARGETS (a JSON list of {name, kind, host, port}) as a
stranger, with no credential, and prints one JSON object: each endpoint's outcome.

  timeout         the connection was never answered (a NetworkPolicy dropped it)
  closed: ...     refused at the TCP level
  grpc: CODE      connected; the gRPC call ended with CODE (UNAUTHENTICATED: the token)
  redis: ...      connected; Redis's answer to a GET (NOAUTH: the ACL user)
  http: STATUS    connected; the HTTP status of GET /metrics
"""

import json
import socket
import sys
import urllib.request

TIMEOUT = 4.0


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
            return f"redis: {s.recv(512).decode(errors='replace').strip()}"
    if kind == "http":
        try:
            return f"http: {urllib.request.urlopen(f'http://{host}:{port}/metrics', timeout=TIMEOUT).status}"
        except OSError as exc:
            return f"http: {exc}"
    import grpc  # kind: a gRPC method's full name, called with an empty request

    with grpc.insecure_channel(f"{host}:{port}") as channel:
        call = channel.unary_unary(kind, request_serializer=lambda m: m,
                                   response_deserializer=lambda m: m)
        try:
            call(b"", timeout=TIMEOUT)
            return "grpc: OK"
        except grpc.RpcError as exc:
            return f"grpc: {exc.code().name}"


def main() -> None:
    out = {}
    for t in json.loads(sys.argv[1]):
        out[t["name"]] = reach(t["host"], t["port"]) or speak(t["kind"], t["host"], t["port"])
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
