"""Dockerfiles lint clean with hadolint; versions agree across package, images, chart."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted(REPO.glob("images/*/Dockerfile"))


def hadolint() -> str:
    exe = Path(sys.executable).with_name("hadolint")
    return str(exe) if exe.exists() else shutil.which("hadolint") or "hadolint"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_lints_clean(path):
    proc = subprocess.run([hadolint(), "--failure-threshold", "info", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_versions_agree():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((REPO / "charts/rljob-operator/Chart.yaml").read_text())
    assert chart["appVersion"] == version
    for path in DOCKERFILES:
        assert re.search(rf"ARG RLJOB_VERSION={re.escape(version)}\n", path.read_text()), path
    from rljob.api.spec import RLJobSpec
    assert RLJobSpec.model_fields["image"].default.endswith(f":{version}")
