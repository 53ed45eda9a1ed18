"""The committed gRPC code is what grpcio-tools generates from each .proto."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from grpc_tools import protoc

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


@pytest.mark.parametrize("proto", ["rljob/transferqueue/proto/transferqueue.proto",
                                   "rljob/weights/proto/weights.proto"])
def test_generated_code_is_current(tmp_path, proto):
    stem = Path(proto).stem
    (tmp_path / proto).parent.mkdir(parents=True)
    shutil.copy(RUNTIME / proto, tmp_path / proto)
    assert protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}",
                        f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                        str(tmp_path / proto)]) == 0
    for name in (f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"):
        rel = Path(proto).parent / name
        assert (tmp_path / rel).read_text() == (RUNTIME / rel).read_text(), (
            f"{rel} is stale: regenerate with python -m grpc_tools.protoc -I runtime "
            "--python_out=runtime --pyi_out=runtime --grpc_python_out=runtime " + proto)
