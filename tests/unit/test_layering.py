"""Layers stay apart: the operator's TransferQueue reader loads the wire format
only (not the client, the controller or Redis), and the runtime's client does not
load the server."""

from __future__ import annotations

import subprocess
import sys


def _loaded(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return set(out.stdout.split())


def test_the_operators_stats_reader_loads_the_wire_format_only():
    loaded = _loaded("import rljob_operator.stats")
    assert "rljob.transferqueue.proto.transferqueue_pb2" in loaded
    assert not loaded & {"redis", "rljob.transferqueue.client",
                         "rljob.transferqueue.controller", "rljob.transferqueue.service"}


def test_the_client_does_not_load_the_server():
    loaded = _loaded("from rljob.transferqueue import TransferQueueClient")
    assert "rljob.transferqueue.wire" in loaded
    assert "rljob.transferqueue.service" not in loaded


def test_the_runtime_never_imports_the_operator():
    """The operator imports the runtime (the contract, the builders, the planner),
    never the other way round."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "runtime" / "rljob"
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(root)}: {n}" for n in names
                      if n.split(".")[0] == "rljob_operator"]
    assert found == []
