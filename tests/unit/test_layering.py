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


def test_the_contract_is_written_once():
    """Ports, the password's environment variable and the preflight container's exit
    code are spelled in rljob/contract.py only; the builders and the operator take
    them from there, not from the preflight check (an arrow back up)."""
    import ast
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    contract = repo / "runtime" / "rljob" / "contract.py"
    tree = ast.parse(contract.read_text())
    assert [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
            and n.module != "__future__"] == []  # every layer can read it
    spelled = re.compile(r"\b(50051|50052|29500)\b|RLJOB_TQ_PASSWORD")
    found = [f"{p.relative_to(repo)}:{i}" for root in ("runtime/rljob", "operator")
             for p in (repo / root).rglob("*.py")
             if p != contract and "proto" not in p.parts
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if spelled.search(line)]
    assert found == []
    for module in ("rljob.api.builders", "rljob_operator.reconcile"):
        assert "rljob.preflight" not in _loaded(f"import {module}"), module


def test_the_worker_command_line_is_the_parsers():
    """`worker_argv`, which the pods' containers and `rljob run` start workers with,
    takes exactly the flags `rljob worker ROLE` parses, and the parser reads back what
    it wrote."""
    import pytest
    import typer.main

    from rljob.cli import app
    from rljob.contract import WORKER_FLAGS, worker_argv

    worker = typer.main.get_command(app).commands["worker"]
    assert set(worker.commands) == set(WORKER_FLAGS)
    for role, command in worker.commands.items():
        assert {p.name for p in command.params} == set(WORKER_FLAGS[role]), role
    argv = worker_argv("trainer", job="j.yaml", tq="h:1", rank=2, resume=True, run_dir=None)
    assert argv == ["worker", "trainer", "--job", "j.yaml", "--tq", "h:1", "--rank", "2",
                    "--resume"]
    ctx = worker.commands["trainer"].make_context("trainer", argv[2:])
    assert (ctx.params["job"].name, ctx.params["tq"], ctx.params["rank"],
            ctx.params["resume"]) == ("j.yaml", "h:1", 2, True)
    urls = worker_argv("transferqueue", redis=["redis://a", "redis://b"])
    assert worker.commands["transferqueue"].make_context(
        "transferqueue", urls[2:]).params["redis"] == ["redis://a", "redis://b"]
    with pytest.raises(ValueError, match="rljob worker rollout takes no rank"):
        worker_argv("rollout", rank=1)


# the runtime's packages and modules, lowest first: each may import those before it,
# never one after it (the offline planner and the command line sit on top of the
# workers, the workers on the workflow and the TransferQueue; the benchmarks are a
# package of their own, rljob_bench, beside the runtime)
ORDER = ("contract", "api", "infra", "sampling", "inputs", "transferqueue", "weights",
         "reward", "tools", "environments", "workflow", "scorer", "trainer", "rollout", "planner",
         "preflight", "profiler", "progress", "local", "liveview", "cli", "__main__")
# imports that run up, each with its reason (none today)
KNOWN: dict[tuple[str, str], str] = {}


def _imports(path, package: list[str]):
    """The rljob modules `path` imports (each as its dotted parts), function-level too."""
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            if node.module:
                yield base + node.module.split(".")
            else:
                yield from (base + [a.name] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rljob."):
            yield node.module.split(".")
        elif isinstance(node, ast.Import):
            yield from (a.name.split(".") for a in node.names if a.name.startswith("rljob."))


def test_no_import_runs_back_up_the_layers():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "runtime" / "rljob"
    up, unknown = [], set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        me = rel.with_suffix("").parts[0]
        if "proto" in rel.parts or me == "__init__":
            continue
        for module in _imports(path, ["rljob", *rel.parts[:-1]]):
            other = module[1] if len(module) > 1 else ""
            if other in ("", "__version__") or other == me:
                continue
            if me not in ORDER or other not in ORDER:
                unknown.add(me if me not in ORDER else other)
            elif ORDER.index(other) > ORDER.index(me) and (str(rel), other) not in KNOWN:
                up.append(f"{rel} imports rljob.{'.'.join(module[1:])}")
    assert not unknown, f"not in the layering order: {sorted(unknown)}"
    assert up == []


def test_the_benchmarks_stay_outside_the_product():
    """rljob_bench imports the runtime; the runtime imports it only where `rljob
    bench` runs one (the command group, at the command), and no installed module
    finds files by the repository's layout or reads a benchmark's switch."""
    import ast
    import re
    from pathlib import Path

    runtime = Path(__file__).resolve().parents[2] / "runtime"
    found = []
    for path in sorted((runtime / "rljob").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(runtime)}:{node.lineno}" for n in names
                      if n.split(".")[0] == "rljob_bench"
                      and (path.relative_to(runtime).as_posix() != "rljob/cli/bench.py"
                           or node.col_offset == 0)]
    assert found == []
    spelled = re.compile(r"parents\[\d\]|RLJOB_LENGTH_ORACLE")
    assert [f"{p.relative_to(runtime)}:{i}" for root in ("rljob", "rljob_bench")
            for p in (runtime / root).rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if spelled.search(line)] == []
