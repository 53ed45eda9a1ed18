"""What crosses the TransferQueue's gRPC wire, shared by the service, the clients,
the storage units and the operator: the channel options, the enum mappings of the
proto, column specs to and from the proto."""

from __future__ import annotations

from .proto import transferqueue_pb2 as pb
from .schema import ColumnError, ColumnSpec, TaskSpec

KIND_TO_PB = {"tensor": pb.TENSOR, "scalar": pb.SCALAR, "json": pb.JSON}
PB_TO_KIND = {v: k for k, v in KIND_TO_PB.items()}
# the claim policies the proto's enum names (new ones travel by name: policy_name)
POLICY = {pb.CLAIM_POLICY_UNSPECIFIED: "fifo", pb.FIFO: "fifo", pb.GROUP: "group",
          pb.TOKEN_BALANCED: "token_balanced", pb.LONGEST_FIRST: "longest_first",
          pb.SHORTEST_FIRST: "shortest_first"}
POLICY_PB = {v: k for k, v in POLICY.items() if k}
STALE = {pb.STALE_POLICY_UNSPECIFIED: "discard", pb.DISCARD: "discard",
         pb.REGENERATE: "regenerate"}
# gRPC caps messages at 4 MiB by default; cells can be larger
GRPC_OPTIONS = [("grpc.max_send_message_length", 1 << 30),
                ("grpc.max_receive_message_length", 1 << 30)]
# clients: reconnect promptly when the controller pod comes back
CLIENT_OPTIONS = GRPC_OPTIONS + [("grpc.initial_reconnect_backoff_ms", 100),
                                 ("grpc.min_reconnect_backoff_ms", 100),
                                 ("grpc.max_reconnect_backoff_ms", 1000)]


def column_to_pb(c: ColumnSpec) -> pb.ColumnSpec:
    return pb.ColumnSpec(name=c.name, kind=KIND_TO_PB[c.kind], dtype=c.dtype,
                         trailing_shape=list(c.trailing_shape))


def column_from_pb(c: pb.ColumnSpec) -> ColumnSpec:
    if c.kind not in PB_TO_KIND:
        raise ColumnError(f"column {c.name!r}: kind must be TENSOR, SCALAR or JSON")
    return ColumnSpec(c.name, PB_TO_KIND[c.kind], c.dtype, tuple(c.trailing_shape))


def task_to_pb(t: TaskSpec) -> pb.TaskSpec:
    return pb.TaskSpec(name=t.name, consumes=sorted(t.consumes),
                       produces=[column_to_pb(c) for c in t.produces])


def task_from_pb(t: pb.TaskSpec) -> TaskSpec:
    return TaskSpec(t.name, frozenset(t.consumes), tuple(column_from_pb(c) for c in t.produces))
