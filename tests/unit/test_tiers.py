"""A tier the test command set up never skips silently (tests/tiers.py): with
RLJOB_REQUIRE_TIERS naming it, a prerequisite that is missing (a vLLM that does not
import, a node that cannot run) fails the pytest run with one line naming it; without,
the tier's tests skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

BROKEN_VLLM = '''
import pytest
from tests.tiers import import_or_skip
import_or_skip("vllm", "rljob_no_such_vllm", "the vLLM tier runs in its environment")

def test_generates():
    pass
'''

NO_NODE = '''
import pytest
from tests.tiers import unavailable

@pytest.fixture
def node():
    unavailable("node", "a node cannot run here: missing containerd")

def test_on_the_node(node):
    pass
'''


def _pytest(tmp_path: Path, source: str, require: str | None) -> subprocess.CompletedProcess:
    test = tmp_path / "test_tier_case.py"
    test.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "RLJOB_REQUIRE_TIERS"}
    if require is not None:
        env["RLJOB_REQUIRE_TIERS"] = require
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p",
                           "no:cacheprovider", "--rootdir", str(tmp_path), str(test)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


@pytest.mark.parametrize("source,tier,why", [
    (BROKEN_VLLM, "vllm", "import rljob_no_such_vllm failed (ModuleNotFoundError"),
    (NO_NODE, "node", "a node cannot run here: missing containerd"),
])
def test_a_required_tier_that_cannot_run_fails_the_run_and_says_why(tmp_path, source, tier,
                                                                   why):
    skipped = _pytest(tmp_path, source, None)  # 5: a module skipped whole, nothing ran
    assert skipped.returncode in (0, 5) and "1 skipped" in skipped.stdout, skipped.stdout
    other = _pytest(tmp_path, source, "megatron")  # another tier required: still a skip
    assert other.returncode in (0, 5) and "1 skipped" in other.stdout, other.stdout
    failed = _pytest(tmp_path, source, f"node, {tier}")
    assert failed.returncode not in (0, 5), failed.stdout
    line = f"the {tier} tier was set up by the test command but cannot run: "
    assert line in failed.stdout and why in failed.stdout, failed.stdout
    assert "skipped" not in failed.stdout.splitlines()[-1], failed.stdout
