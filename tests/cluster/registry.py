"""A real image registry for the node: the CNCF distribution registry (built from its Go
module by tests/gotools/build.sh), served over TLS with a CA of its own, that the
images are pushed to with ``python -m images.push`` (crane) and the node's containerd
pulls from, trusting that CA through its hosts.toml, as a platform's nodes pull from
the platform's registry.

Its storage is the run's own (under `workdir`) and goes with it: the images' layers
are several GB, which a machine of the test kind cannot keep twice beside the node's
image store.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFIG = """\
version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
  tls:
    certificate: {cert}
    key: {key}
"""

HOSTS_TOML = """\
server = "https://{host}"

[host."https://{host}"]
  capabilities = ["pull", "resolve"]
  ca = "{ca}"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _certificate(into: Path) -> tuple[Path, Path, Path]:
    """A CA of the registry's own and a server certificate for 127.0.0.1 it signs
    (infra/tls.make, as a job's), as files: (CA, certificate, key)."""
    from rljob.infra import tls

    pems = tls.make(days=2, names=("localhost",), ips=("127.0.0.1",))
    files = into / "ca.crt", into / "tls.crt", into / "tls.key"
    for path, text in zip(files, (pems.ca, pems.cert, pems.key)):
        path.write_text(text)
    files[2].chmod(0o600)
    return files


@dataclass
class Registry:
    bin_dir: Path
    workdir: Path
    port: int = 0
    proc: subprocess.Popen | None = None
    ca: Path | None = None
    pushed: dict[str, str] = field(default_factory=dict)  # source name -> pinned name

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "Registry":
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "storage").mkdir(exist_ok=True)
        self.ca, cert, key = _certificate(self.workdir)
        self.port = _free_port()
        config = self.workdir / "config.yml"
        config.write_text(CONFIG.format(storage=self.workdir / "storage", port=self.port,
                                        cert=cert, key=key))
        log = open(self.workdir / "registry.log", "ab")
        self.proc = subprocess.Popen([str(self.bin_dir / "registry"), "serve", str(config)],
                                     stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the registry did not start:\n{self.log_tail()}")
                time.sleep(0.1)

    def trust_on(self, node) -> None:
        """The node's containerd pulls from here, trusting the registry's CA."""
        hosts = node.registry_hosts / self.host
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "hosts.toml").write_text(HOSTS_TOML.format(host=self.host, ca=self.ca))

    def push(self, build_output: str, path: str = "rljob",
             command: list[str] | None = None) -> dict[str, str]:
        """``python -m images.push`` of images.build's output lines, as the docs run it
        (`command`: the docs' own words, the registry's path already in place), with
        this registry's CA and crane; returns {source name: name by digest}."""
        argv = command or ["python", "-m", "images.push", f"{self.host}/{path}"]
        assert argv[:3] == ["python", "-m", "images.push"], argv
        done = subprocess.run(
            [sys.executable, *argv[1:], "--ca", str(self.ca),
             "--crane", str(self.bin_dir / "crane")],
            input=build_output, capture_output=True, text=True, cwd=REPO, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"images.push failed: {done.stderr[-3000:]}\n{self.log_tail()}")
        sources = [line.split()[0] for line in build_output.splitlines() if line.strip()]
        pinned = done.stdout.split()
        assert len(pinned) == len(sources), (done.stdout, build_output)
        self.pushed.update(zip(sources, pinned))
        return dict(zip(sources, pinned))

    def relabel(self, image: str, tag: str, labels: dict[str, str]) -> str:
        """A new image of `image`'s layers with `labels` added to its config (another
        digest, nothing uploaded but the config and manifest), as `tag`; returns it
        by digest (`crane mutate`)."""
        done = subprocess.run(
            [str(self.bin_dir / "crane"), "mutate", image, "-t", tag,
             *(f"--label={k}={v}" for k, v in labels.items())],
            capture_output=True, text=True, timeout=120,
            env=dict(os.environ, SSL_CERT_FILE=str(self.ca)))
        if done.returncode != 0:
            raise RuntimeError(f"crane mutate failed: {done.stderr[-2000:]}")
        return done.stdout.strip().splitlines()[-1]

    def served(self, kind: str, repository: str = "") -> int:
        """How many GETs of `kind` (manifests, blobs) the registry answered with 200, of
        `repository` (all where empty), from its access log."""
        text = (self.workdir / "registry.log").read_text(errors="replace")
        want = f'"GET /v2/{repository}' if repository else '"GET /v2/'
        return sum(1 for line in text.splitlines()
                   if want in line and f"/{kind}/" in line and '" 200 ' in line)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.workdir / "registry.log").read_text(
                errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.workdir / "storage", ignore_errors=True)  # the layers go
