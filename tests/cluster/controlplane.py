"""A real Kubernetes control plane on loopback: etcd + kube-apiserver.

Binaries come from tests/gotools/build.sh (built from Go modules, cached under
~/.cache). The apiserver runs with RBAC authorization and a static admin token;
an admin kubeconfig is written next to the data. No controller-manager is
started unless asked for (garbage collection, service accounts).

With ``for_node=True`` the plane is made ready for a node (tests/cluster/node.py):
the apiserver listens on the machine's non-loopback address and advertises it
(pods reach it through the ``kubernetes`` Service), serves a certificate from a
test CA whose names include the Service IP and that address, authorizes with
Node,RBAC, and holds a client certificate for the kubelet's API (exec, logs);
the controller-manager always runs, publishes the CA to pods (``--root-ca-file``)
and uses one service account per controller. Tokens for the node's components
(kubelet, kube-proxy, kube-scheduler) are in the token file, see
``write_kubeconfig``.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
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
    """Directory with kube-apiserver, kube-controller-manager, kubectl, etcd, helm
    and the node's kubelet, kube-scheduler, kube-proxy, coredns, pause, probe."""
    env_bin = os.environ.get("RLJOB_GOTOOLS_BIN")
    if env_bin:
        return Path(env_bin)
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


# a list's objects as their metadata alone (`ControlPlane.get(metadata_only=True)`)
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM, and SIGKILL after `timeout` seconds; waits for it either way."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def log_tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a process's log ("" before it writes one)."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_ip() -> str:
    """The machine's non-loopback IPv4 address (the one its default route uses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))  # no packet is sent for a UDP connect
            ip = s.getsockname()[0]
        except OSError:
            ip = ""
    if ip and not ip.startswith("127."):
        return ip
    for addr in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
        if not addr[4][0].startswith("127."):
            return addr[4][0]
    raise RuntimeError("no non-loopback IPv4 address on this machine")


_OPENSSL_CNF = """[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
authorityKeyIdentifier = keyid
subjectAltName = {sans}
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
"""


def make_pki(pki: Path, server_sans: list[str],
             clients: dict[str, str] | None = None) -> None:
    """A test CA (pki/ca.crt, ca.key), a serving certificate (pki/server.crt,
    server.key) for ``server_sans`` (``IP:...``/``DNS:...``) and one client
    certificate per ``clients`` entry (file stem -> subject such as
    ``/O=system:masters/CN=name``), all EC P-256 keys signed by the CA."""
    pki.mkdir(parents=True, exist_ok=True)
    cnf = pki / "openssl.cnf"
    cnf.write_text(_OPENSSL_CNF.format(sans=",".join(server_sans)))
    newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(args: list[str], stdin: bytes | None = None) -> bytes:
        return subprocess.run(["openssl", *args], input=stdin, check=True,
                              capture_output=True).stdout

    run(["req", "-x509", "-config", str(cnf), "-extensions", "ca", *newkey,
         "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"), "-days", "3650",
         "-subj", "/CN=rljob-test-ca"])
    serial = 1
    for stem, subject, ext in [("server", "/CN=kube-apiserver", "server"),
                               *[(k, v, "client") for k, v in (clients or {}).items()]]:
        serial += 1
        csr = run(["req", "-new", "-config", str(cnf), *newkey,
                   "-keyout", str(pki / f"{stem}.key"), "-subj", subject])
        run(["x509", "-req", "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
             "-set_serial", str(serial), "-days", "3650", "-extfile", str(cnf),
             "-extensions", ext, "-out", str(pki / f"{stem}.crt")], stdin=csr)


@dataclass
class ControlPlane:
    bin_dir: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rljob-kube-")))
    with_controller_manager: bool = False
    # a kube-scheduler as the admin, and the node lifecycle controller (it lifts the
    # not-ready taint of simulated nodes); the node tier starts its own, as itself
    with_scheduler: bool = False
    token: str = "rljob-test-admin-token"
    procs: list[subprocess.Popen] = field(default_factory=list)
    server: str = ""
    # a node may join (see the module docstring); node_name is the one node's name
    for_node: bool = False
    node_name: str = "rljob-node"
    node_ip: str = ""
    service_cidr: str = "10.96.0.0/16"
    service_ip: str = "10.96.0.1"  # the kubernetes Service (first of service_cidr)
    # identity -> (token, user, groups) for the node's components, with for_node
    identities: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    # more of the apiserver's flags (the scale bench's audit log, webhook routing)
    apiserver_args: tuple[str, ...] = ()
    _conn: http.client.HTTPSConnection | None = None

    @property
    def ca_file(self) -> Path:
        """The CA of the apiserver's serving certificate (for_node only)."""
        return self.workdir / "pki" / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def env(self) -> dict[str, str]:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        env["KUBECACHEDIR"] = str(self.workdir / "kube-cache")  # not ~/.kube/cache
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

    def get(self, path: str, metadata_only: bool = False, **query: str) -> dict:
        """GET of an API path (query: e.g. labelSelector) as the admin, decoded:
        what a test's once-a-second poll reads, without a kubectl process a call
        (about 0.07 CPU-s each); {} where it is not found. `metadata_only`: each
        object's metadata alone (PartialObjectMetadata), as a poll of many objects
        asks for it (a list of a thousand pods is megabytes)."""
        body = self.read(path, METADATA_ONLY if metadata_only else None, **query)
        return {} if body is None else json.loads(body)

    def read(self, path: str, accept: str | None = None, **query: str) -> bytes | None:
        """GET of a path of the API server (its /metrics too) as the admin, over one
        kept-alive connection: the body, or None where it is not found."""
        from urllib.parse import urlencode

        url = path + ("?" + urlencode(query) if query else "")
        headers = {"Authorization": f"Bearer {self.token}"}
        if accept:
            headers["Accept"] = accept
        for attempt in (1, 2):
            if self._conn is None:
                if self.ca_file.exists():
                    ctx = ssl.create_default_context(cafile=str(self.ca_file))
                else:  # the apiserver's own self-signed certificate
                    ctx = ssl._create_unverified_context()
                self._conn = http.client.HTTPSConnection(self.server.removeprefix("https://"),
                                                         context=ctx, timeout=30)
            try:
                self._conn.request("GET", url, headers=headers)
                resp = self._conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise
                continue
            if resp.status == 404:
                return None
            if resp.status != 200:
                raise AssertionError(f"GET {url}: {resp.status} {body[:500]!r}")
            return body
        return None

    def wait_established(self, crd: str, timeout: float = 60) -> None:
        """Until the CustomResourceDefinition `crd` is Established (`kubectl wait` fails
        at once while it has no conditions yet)."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.kubectl("get", f"crd/{crd}", "-o",
                               'jsonpath={.status.conditions[?(@.type=="Established")].status}',
                               check=False)
            if out.stdout.strip() == "True":
                return
            assert time.monotonic() < deadline, f"the CRD {crd} is not Established: {out}"
            time.sleep(0.2)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [str(self.bin_dir / "kubectl"), *args], input=input, text=True,
            capture_output=True, env=self.env(), timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{proc.stderr}")
        return proc

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        """A process of the cluster, its output in workdir/<name>.log, stopped with it."""
        log = open(self.workdir / f"{name}.log", "wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def log_tail(self, name: str, lines: int = 40) -> str:
        return log_tail(self.workdir / f"{name}.log", lines)

    def start(self, timeout: float = 120) -> ControlPlane:
        started = time.monotonic()
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self.spawn("etcd", [
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
        tokens = [f'{self.token},admin,admin-uid,"system:masters"']
        address = "127.0.0.1"
        serving = [f"--cert-dir={self.workdir / 'certs'}", "--authorization-mode=RBAC"]
        if self.for_node:
            address = self.node_ip = self.node_ip or host_ip()
            pki = self.workdir / "pki"
            make_pki(pki, [
                f"IP:{self.service_ip}", f"IP:{address}", "IP:127.0.0.1", "DNS:localhost",
                "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ], clients={"kubelet-client": "/O=system:masters/CN=kube-apiserver-kubelet-client"})
            self.identities = {
                "kubelet": (secrets.token_hex(16), f"system:node:{self.node_name}",
                            "system:nodes"),
                "kube-proxy": (secrets.token_hex(16), "system:kube-proxy", ""),
                "kube-scheduler": (secrets.token_hex(16), "system:kube-scheduler", ""),
            }
            tokens += [f'{tok},{user},{user},"{groups}"' if groups else f"{tok},{user},{user}"
                       for tok, user, groups in self.identities.values()]
            serving = [
                f"--tls-cert-file={pki / 'server.crt'}",
                f"--tls-private-key-file={pki / 'server.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
            ]
        (self.workdir / "tokens.csv").write_text("\n".join(tokens) + "\n")
        self.server = f"https://{address}:{api_port}"
        self.spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={address}",
            f"--advertise-address={address}",
            f"--secure-port={api_port}",
            *serving,
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            f"--service-account-key-file={sa_key}",
            f"--service-account-signing-key-file={sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-cluster-ip-range={self.service_cidr}",
            "--allow-privileged=true",
            "--v=1",
            *self.apiserver_args,
        ])
        self._write_kubeconfig()
        self._wait_ready(timeout - (time.monotonic() - started))
        if self.with_controller_manager or self.for_node:
            if self.for_node or self.with_scheduler:
                # the node lifecycle controller lifts the not-ready taint once the
                # kubelet reports Ready; pods get the CA in kube-root-ca.crt
                cm = ["--controllers=*,-nodeipam,-cloud-node-lifecycle",
                      f"--use-service-account-credentials={str(self.for_node).lower()}"]
                if self.for_node:
                    cm.append(f"--root-ca-file={self.ca_file}")
            else:
                cm = ["--controllers=*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle",
                      "--use-service-account-credentials=false"]
            self.spawn("kube-controller-manager", [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                *cm,
                f"--service-account-private-key-file={sa_key}",
                "--leader-elect=false",
            ])
        if self.with_scheduler:
            self.spawn("kube-scheduler", [
                str(self.bin_dir / "kube-scheduler"), f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--authentication-skip-lookup=true",
                "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
                "--leader-elect=false",
            ])
        self.start_seconds = time.monotonic() - started
        return self

    def _write_kubeconfig(self) -> None:
        self.write_kubeconfig(self.kubeconfig)

    def write_kubeconfig(self, path: Path, identity: str = "admin") -> Path:
        """A kubeconfig for the admin or, with for_node, one of ``identities``."""
        token = self.token if identity == "admin" else self.identities[identity][0]
        trust = (f"certificate-authority: {self.ca_file}" if self.for_node
                 else "insecure-skip-tls-verify: true")
        path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: {self.server}
    {trust}
users:
- name: {identity}
  user:
    token: {token}
contexts:
- name: test
  context: {{cluster: test, user: {identity}, namespace: default}}
current-context: test
""")
        return path

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
        # one at a time, last started first: an apiserver whose etcd is gone spends
        # its whole shutdown timeout retrying it
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        if not os.environ.get("RLJOB_KEEP_CLUSTER_DIR"):
            shutil.rmtree(self.workdir, ignore_errors=True)
