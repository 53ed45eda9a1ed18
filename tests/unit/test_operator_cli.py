"""`rljob-operator`'s command line: --version, -h, and one clear line (no traceback)
when there is no cluster to talk to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXE = Path(sys.executable).with_name("rljob-operator")


def operator(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    env["HOME"] = str(home)  # no ~/.kube/config
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, env=env,
                          timeout=60)


def test_version_and_short_help(tmp_path):
    from rljob import __version__

    out = operator("--version", home=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == f"rljob-operator {__version__}"
    out = operator("-h", home=tmp_path)
    assert out.returncode == 0 and "--kubeconfig FILE" in out.stdout and "--context" in out.stdout
    assert "--priority N" in out.stdout and "--namespace NAMESPACE" in out.stdout
    assert "<" not in out.stdout, "type tags in the help"


def test_no_cluster_is_one_line_naming_the_fix(tmp_path):
    out = operator("--liveness-port", "0", "--metrics-port", "0", home=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert lines[0].startswith("rljob-operator: no cluster to talk to")
    assert "--kubeconfig FILE" in lines[0]


def test_a_missing_kubeconfig_file_is_named(tmp_path):
    out = operator("--kubeconfig", str(tmp_path / "nope.yaml"), home=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert f"--kubeconfig {tmp_path / 'nope.yaml'}" in out.stderr


def test_a_malformed_kubeconfig_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters: [\n  - {name: a\n")
    out = operator("--kubeconfig", str(bad), home=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"rljob-operator: --kubeconfig {bad}")


def test_an_unreachable_cluster_is_one_line_naming_it(tmp_path):
    from tests.cluster.controlplane import free_port

    port = free_port()  # nothing listens there
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    out = operator("--kubeconfig", str(cfg), "--peering", "p", home=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert f"127.0.0.1:{port}" in out.stderr and "cannot reach" in out.stderr
