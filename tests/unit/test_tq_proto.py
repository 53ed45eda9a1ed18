"""The committed gRPC code is what grpcio-tools generates from the .proto."""

from __future__ import annotations

import shutil
from pathlib import Path

from grpc_tools import protoc

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
PROTO = "rljob/transferqueue/proto/transferqueue.proto"


def test_generated_code_is_current(tmp_path):
    (tmp_path / PROTO).parent.mkdir(parents=True)
    shutil.copy(RUNTIME / PROTO, tmp_path / PROTO)
    assert protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}",
                        f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                        str(tmp_path / PROTO)]) == 0
    for name in ("transferqueue_pb2.py", "transferqueue_pb2.pyi", "transferqueue_pb2_grpc.py"):
        rel = Path(PROTO).parent / name
        assert (tmp_path / rel).read_text() == (RUNTIME / rel).read_text(), (
            f"{rel} is stale: regenerate with python -m grpc_tools.protoc -I runtime "
            "--python_out=runtime --pyi_out=runtime --grpc_python_out=runtime " + PROTO)
