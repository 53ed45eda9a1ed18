"""A real Kubernetes control plane on loopback: etcd + kube-apiserver.

Binaries come from tests/gotools/build.sh (built from Go modules, cached under
~/.cache). The apiserver runs with RBAC authorization and a static admin token;
an admin kubeconfig is written next to the data. No controller-manager is
started unless asked for (garbage collection, service accounts).
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tests" / "gotools" / "build.sh"


def gotools_bin() -> Path:
    """Directory with kube-apiserver, kube-controller-manager, kubectl, etcd, helm."""
    env_bin = os.environ.get("RLJOB_GOTOOLS_BIN")
    if env_bin:
        return Path(env_bin)
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ControlPlane:
    bin_dir: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rljob-kube-")))
    with_controller_manager: bool = False
    token: str = "rljob-test-admin-token"
    procs: list[subprocess.Popen] = field(default_factory=list)
    server: str = ""

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def env(self) -> dict[str, str]:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    @contextmanager
    def namespace(self, prefix: str) -> Iterator[str]:
        """A fresh namespace for one test, deleted (without waiting) afterwards."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.kubectl("create", "namespace", name)
        try:
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=false", check=False)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [str(self.bin_dir / "kubectl"), *args], input=input, text=True,
            capture_output=True, env=self.env(), timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{proc.stderr}")
        return proc

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def start(self, timeout: float = 120) -> ControlPlane:
        started = time.monotonic()
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn("etcd", [
            str(self.bin_dir / "etcd"),
            "--name=rljob-test",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=rljob-test=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",  # test data; skipping fsync keeps it fast
            "--log-level=warn",
        ])

        sa_key = self.workdir / "sa.key"
        subprocess.run(["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True,
                       capture_output=True)
        (self.workdir / "tokens.csv").write_text(
            f'{self.token},admin,admin-uid,"system:masters"\n')
        self.server = f"https://127.0.0.1:{api_port}"
        self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--cert-dir={self.workdir / 'certs'}",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={sa_key}",
            f"--service-account-signing-key-file={sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--allow-privileged=true",
            "--v=1",
        ])
        self._write_kubeconfig()
        self._wait_ready(timeout - (time.monotonic() - started))
        if self.with_controller_manager:
            self._spawn("kube-controller-manager", [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--controllers=*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle",
                f"--service-account-private-key-file={sa_key}",
                "--use-service-account-credentials=false",
                "--leader-elect=false",
            ])
        self.start_seconds = time.monotonic() - started
        return self

    def _write_kubeconfig(self) -> None:
        self.kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: {self.server}
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: {self.token}
contexts:
- name: test
  context: {{cluster: test, user: admin, namespace: default}}
current-context: test
""")

    def _wait_ready(self, timeout: float) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(f"{self.server}/readyz",
                                     headers={"Authorization": f"Bearer {self.token}"})
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    self.stop()
                    raise RuntimeError(
                        f"{p.args[0]} exited with {p.returncode}:\n"
                        f"{self.log_tail(Path(p.args[0]).name)}")
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.5)
        logs = self.log_tail("kube-apiserver")
        self.stop()
        raise TimeoutError(f"kube-apiserver not ready after {timeout:.0f}s ({last}):\n{logs}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        if not os.environ.get("RLJOB_KEEP_CLUSTER_DIR"):
            shutil.rmtree(self.workdir, ignore_errors=True)
