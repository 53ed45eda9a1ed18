"""`rljob crd` and `rljob validate` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.cases import INVALID, TEN_LINE_YAML

REPO = Path(__file__).resolve().parents[2]


def rljob(*args, input=None, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "rljob", *args], capture_output=True,
                          text=True, input=input, cwd=cwd, timeout=120)


def test_validate_accepts_examples():
    examples = sorted(str(p) for p in (REPO / "examples").glob("*.yaml"))
    out = rljob("validate", *examples)
    assert out.returncode == 0, out.stderr
    assert len(examples) >= 4 and out.stdout.count(": valid") == len(examples)


def test_validate_reports_one_line_per_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("---\n".join(json.dumps(c.document()) + "\n" for c in INVALID[:3]))
    good = tmp_path / "good.yaml"
    good.write_text(TEN_LINE_YAML)
    out = rljob("validate", str(good), str(bad))
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith(f"{bad}: ") for line in lines)
    assert INVALID[0].expect in lines[0]
    assert f"{good}: valid" in out.stdout


def test_validate_never_tracebacks(tmp_path):
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    for args in (["validate", str(tmp_path / "nope.yaml")], ["validate", str(binary)],
                 ["validate", "-"]):
        out = rljob(*args, input="key: [1, 2")
        assert out.returncode == 1
        assert "Traceback" not in out.stderr and out.stderr.strip(), out.stderr


def test_crd_check_detects_drift(tmp_path):
    target = tmp_path / "rljob.yaml"
    assert rljob("crd", "-o", str(target)).returncode == 0
    assert rljob("crd", "--check", "-o", str(target)).returncode == 0
    target.write_text(target.read_text().replace("maxLength: 512", "maxLength: 513", 1))
    out = rljob("crd", "--check", "-o", str(target))
    assert out.returncode == 1 and "out of date" in out.stderr
