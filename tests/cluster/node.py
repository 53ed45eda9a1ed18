"""A real Kubernetes node on this machine, joined to a ControlPlane(for_node=True).

The node runs pods for real: containerd + runc + the CNI plugins come from Debian
packages (``APT_PACKAGES``); kube-scheduler, kubelet, kube-proxy (iptables mode)
and CoreDNS come from tests/gotools/build.sh, like the control plane. Images are
packed locally from those binaries (images/oci.py) and imported into
containerd, and pods use them with ``imagePullPolicy: Never``:

    rljob.local/pause:test    the pod sandbox (containerd's sandbox_image)
    rljob.local/probe:test    tests/gotools/probe: HTTP server/client, name lookups
    rljob.local/coredns:test  cluster DNS (``Node.dns_ip``), run as a Deployment

CoreDNS runs as a pod, the way clusters run it: it then reads the API through the
``kubernetes`` Service with its service account, which the tests rely on pods doing.

What the test machines (Debian 12 VMs) need: root; containerd's CRI plugin with
``restrict_oom_score_adj`` and ``oomScoreAdj: 0`` for the kubelet and kube-proxy,
since root there lacks CAP_SYS_RESOURCE and cannot lower oom_score_adj below 0
(every sandbox fails in runc otherwise); ``net.ipv4.ip_forward=1`` for the pod bridge.

``stop()`` puts the machine back as ``start()`` found it: pods are deleted through
the API first (so the kubelet tears down their sandboxes and networks), then the
processes are stopped and whatever is left is removed: processes in the pods'
cgroups and containerd shims, mounts, network namespaces, the ``cni0`` bridge and
veths, the KUBE-*/CNI-* iptables chains that were not there before, conntrack
entries of the pod and Service ranges, the sysctls the node's programs change,
the kubepods cgroups and the state directories. containerd's root is an image store
kept between runs (``IMAGE_STORE``): the images it holds, with their unpacked layers,
are not imported again, and its containers are removed at start and stop.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.controlplane import ControlPlane, free_port, log_tail
from images import oci

APT_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "iptables", "conntrack",
                "nftables")
CNI_BIN_DIR = Path("/usr/lib/cni")
HOST_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "iptables",
                 "iptables-save", "iptables-restore", "conntrack", "umount", "ip", "nft")
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy", "coredns", "pause", "probe")
POD_CIDR = "10.244.0.0/24"
BRIDGE = "cni0"
CNI_NETWORK = "rljob-pods"
# sysctls changed while the node runs: the bridge plugin (ip_forward), the kubelet
# (kernel tunables it sets on start) and kube-proxy (route_localnet, unused here)
SYSCTLS = (
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
# host paths the node's programs create outside their own directories
# (the kubelet's device plugin socket is always under /var/lib/kubelet)
HOST_PATHS = (Path("/run/containerd"), Path("/run/netns"), Path("/var/lib/cni"),
              Path("/var/log/containers"), Path("/var/lib/kubelet"))
NETNS_DIR = Path("/run/netns")
CGROUP_ROOT = Path("/sys/fs/cgroup")
IPTABLES_TABLES = ("filter", "nat", "mangle", "raw")
# containerd's root kept between runs (RLJOB_NODE_IMAGE_STORE; "" for none): the images'
# content and unpacked layers, so an image imported again is read and hashed but not
# written and unpacked again (the 3.9 GB runtime image: 60-95 s a run otherwise).
# Emptied when containerd's version changes or it grows past IMAGE_STORE_LIMIT.
IMAGE_STORE = Path(os.environ.get("RLJOB_NODE_IMAGE_STORE",
                                  Path.home() / ".cache" / "rljob" / "node-images"))
IMAGE_STORE_LIMIT = 24 * 2**30
OUR_CHAIN = re.compile(r"^(KUBE-|CNI-)")


def missing_requirements() -> list[str]:
    """Why a node cannot run here (empty when it can)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("needs root (containerd, kubelet, iptables)")
    absent = [c for c in HOST_COMMANDS if not shutil.which(c, path=_path())]
    absent += [str(CNI_BIN_DIR / p) for p in ("bridge", "host-local", "portmap", "loopback")
               if not (CNI_BIN_DIR / p).exists()]
    if absent:
        missing.append(f"missing {', '.join(absent)} (Debian packages: "
                       f"{' '.join(APT_PACKAGES)}; .ci/test installs them)")
    return missing


def _path() -> str:
    parts = os.environ.get("PATH", "").split(os.pathsep)
    for extra in ("/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        if extra not in parts:
            parts.append(extra)
    return os.pathsep.join(p for p in parts if p)


def read_sysctls(names=SYSCTLS) -> dict[str, str | None]:
    out = {}
    for name in names:
        try:
            out[name] = (Path("/proc/sys") / name.replace(".", "/")).read_text().strip()
        except OSError:
            out[name] = None
    return out


def write_sysctl(name: str, value: str) -> None:
    (Path("/proc/sys") / name.replace(".", "/")).write_text(value)


def iptables_chains(family: str = "iptables") -> dict[str, set[str]]:
    """table -> chain names, from ``iptables-save`` (or ``ip6tables-save``)."""
    proc = subprocess.run([f"{family}-save"], capture_output=True, text=True,
                          env=dict(os.environ, PATH=_path()))
    chains: dict[str, set[str]] = {}
    table = ""
    for line in proc.stdout.splitlines():
        if line.startswith("*"):
            table = line[1:]
            chains[table] = set()
        elif line.startswith(":"):
            chains[table].add(line[1:].split()[0])
    return chains


def links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def netns_entries() -> set[str]:
    return set(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else set()


def processes_of(executables: set[str]) -> dict[int, str]:
    """pid -> executable, for running processes whose executable is in the set."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            exe = os.path.realpath(f"/proc/{entry}/exe")
        except OSError:
            continue
        if exe in executables or exe.removesuffix(" (deleted)") in executables:
            found[int(entry)] = exe
    return found


def node_executables(bin_dir: Path) -> set[str]:
    """Real paths of every program a node runs (for leftover-process checks)."""
    exes = {os.path.realpath(bin_dir / b) for b in NODE_BINARIES}
    for cmd in ("containerd", "containerd-shim-runc-v2", "containerd-shim", "runc"):
        found = shutil.which(cmd, path=_path())
        if found:
            exes.add(os.path.realpath(found))
    return exes


@dataclass
class HostState:
    """What the node may change on the machine, to compare before and after."""
    sysctls: dict[str, str | None]
    chains: dict[str, dict[str, set[str]]]
    links: set[str]
    netns: set[str]
    paths: dict[str, bool]
    cgroups: dict[str, bool]

    @classmethod
    def capture(cls) -> HostState:
        return cls(
            sysctls=read_sysctls(),
            chains={f: iptables_chains(f) for f in ("iptables", "ip6tables")},
            links=links(),
            netns=netns_entries(),
            paths={str(p): p.exists() for p in HOST_PATHS},
            cgroups={str(d): (d / "kubepods").exists() for d in _cgroup_hierarchies()},
        )

    def our_chains(self, family: str) -> dict[str, set[str]]:
        """KUBE-*/CNI-* chains there now that were not there at capture time."""
        now = iptables_chains(family)
        before = self.chains.get(family, {})
        return {t: {c for c in cs if OUR_CHAIN.match(c) and c not in before.get(t, set())}
                for t, cs in now.items()}


def _cgroup_hierarchies() -> list[Path]:
    if not CGROUP_ROOT.is_dir():
        return []
    if (CGROUP_ROOT / "cgroup.controllers").exists():  # cgroup v2 only
        return [CGROUP_ROOT]
    return sorted(p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink())


COREFILE = """.:53 {
    errors
    health
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    forward . /etc/resolv.conf
    cache 30
    loop
    reload
    loadbalance
}
"""


def coredns_manifests(image: str, dns_ip: str) -> list[dict]:
    labels = {"k8s-app": "kube-dns"}
    meta = {"name": "coredns", "namespace": "kube-system"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:coredns"},
         "rules": [
             {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
              "verbs": ["list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
              "verbs": ["list", "watch"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns",
                       "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
         "data": {"Corefile": COREFILE}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {**meta, "labels": labels},
         "spec": {
             "replicas": 1,
             "selector": {"matchLabels": labels},
             "template": {
                 "metadata": {"labels": labels},
                 "spec": {
                     "serviceAccountName": "coredns",
                     "dnsPolicy": "Default",  # the node's resolvers, for forward
                     "terminationGracePeriodSeconds": 2,
                     "containers": [{
                         "name": "coredns",
                         "image": image,
                         "imagePullPolicy": "Never",
                         "args": ["-conf", "/etc/coredns/Corefile"],
                         "ports": [
                             {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                             {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                         ],
                         "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181},
                                            "periodSeconds": 1, "failureThreshold": 3},
                         "resources": {"requests": {"cpu": "10m", "memory": "20Mi"}},
                         "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns",
                                           "readOnly": True}],
                     }],
                     "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                 },
             },
         }},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
         "spec": {"selector": labels, "clusterIP": dns_ip, "ports": [
             {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
             {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
         ]}},
    ]


@dataclass
class Node:
    plane: ControlPlane
    bin_dir: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rljob-node-")))
    dns_ip: str = "10.96.0.10"
    with_dns: bool = True
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)  # each process's command line
    images: dict[str, str] = field(default_factory=dict)  # short name -> image reference
    archives: dict[str, Path] = field(default_factory=dict)  # short name -> its archive
    _last_import: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    before: HostState | None = None
    ports: dict[str, int] = field(default_factory=dict)
    image_store: Path | None = field(
        default_factory=lambda: IMAGE_STORE if str(IMAGE_STORE) not in ("", ".") else None)
    root: Path | None = None  # containerd's root: the image store's, or the node's own
    _store_lock: object = None

    @property
    def name(self) -> str:
        return self.plane.node_name

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd.sock"

    @property
    def registry_hosts(self) -> Path:
        """containerd's registry host configuration (certs.d/HOST:PORT/hosts.toml)."""
        return self.workdir / "certs.d"

    def image_targets(self) -> dict[str, str]:
        """Each image name containerd holds for the kubelet, with its target's digest.
        A pulled image has two names: the one pulled and its id (`sha256:...`, the
        kubelet's), both of one target."""
        rows = [line.split() for line in self._ctr("images", "ls").stdout.splitlines()[1:]]
        return {row[0]: row[2] for row in rows if len(row) > 2}

    def pull_image(self, ref: str, names: list[str]) -> None:
        """Pulls `ref` from its registry (as the kubelet would, with the registries'
        hosts.toml: `registry_hosts`) and names it `names` too: only the layers the
        node lacks are fetched, where `ctr images import` reads a whole archive."""
        for args in (("images", "pull", "--hosts-dir", str(self.registry_hosts), ref),
                     *(("images", "tag", "--force", ref, n) for n in names)):
            done = self._ctr(*args, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"ctr {' '.join(args)} failed:\n{done.stderr[-2000:]}")

    def remove_image(self, ref: str) -> None:
        """Removes an image's name from containerd and its content and snapshots with
        it (unless another name holds them): its next use pulls it again."""
        self._ctr("images", "rm", "--sync", ref, timeout=120)

    # -- processes -----------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=dict(os.environ, PATH=_path()))
        log.close()
        self.procs[name] = proc
        self.argv[name] = list(args)
        return proc

    def log_tail(self, name: str, lines: int = 30) -> str:
        return log_tail(self.workdir / f"{name}.log", lines)

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.log_tail(name)}")

    def _stop_proc(self, name: str, timeout: float = 15) -> None:
        p = self.procs.pop(name, None)
        if p is None:
            return
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    # -- API -----------------------------------------------------------------

    def api_get(self, path: str) -> dict:
        ctx = ssl.create_default_context(cafile=str(self.plane.ca_file))
        req = urllib.request.Request(f"{self.plane.server}{path}",
                                     headers={"Authorization": f"Bearer {self.plane.token}"})
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return json.load(resp)

    def _wait(self, what: str, check, timeout: float, interval: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if check():
                    return
            except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
                last = str(exc)
            time.sleep(interval)
        raise TimeoutError(f"{what} not reached after {timeout:.0f}s {last}\n"
                           f"kubelet:\n{self.log_tail('kubelet')}")

    def node_ready(self) -> bool:
        node = self.api_get(f"/api/v1/nodes/{self.name}")
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in node["status"].get("conditions", []))

    # -- start ---------------------------------------------------------------

    def start(self, timeout: float = 180) -> Node:
        missing = missing_requirements()
        if missing:
            raise RuntimeError("; ".join(missing))
        if not self.plane.for_node:
            raise ValueError("the control plane must be started with for_node=True")
        absent = [b for b in NODE_BINARIES if not (self.bin_dir / b).exists()]
        if absent:
            raise FileNotFoundError(f"{', '.join(absent)} not in {self.bin_dir} "
                                    "(an older tests/gotools/build.sh output?)")
        t0 = time.monotonic()
        self.before = HostState.capture()
        try:
            self._start(t0, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, t0: float, timeout: float) -> None:
        deadline = t0 + timeout
        write_sysctl("net.ipv4.ip_forward", "1")
        self._write_cni_config()
        self.root = self._open_image_store()
        self._write_containerd_config()
        self._spawn("containerd", ["containerd", "--config", str(self.workdir / "containerd.toml")])
        self._wait("containerd", self._containerd_up, deadline - time.monotonic(), 0.2)
        self._remove_containers()  # what a run killed before it could stop left in the store
        self.timings["containerd"] = time.monotonic() - t0

        t = time.monotonic()
        self._import_images()
        self.timings["images"] = time.monotonic() - t

        self._start_node_components()
        if self.with_dns:
            self.plane.kubectl("apply", "-f", "-", input="\n---\n".join(
                json.dumps(m) for m in coredns_manifests(self.images["coredns"], self.dns_ip)))
        self._wait("node Ready", self.node_ready, deadline - time.monotonic())
        self.timings["ready"] = time.monotonic() - t0
        self._wait("the imported images in the kubelet's node status", self._images_seen,
                   deadline - time.monotonic())
        self._wait("kube-proxy healthy", self._proxy_healthy, deadline - time.monotonic())
        if self.with_dns:
            self._wait("CoreDNS available", self._dns_available, deadline - time.monotonic())
            self.timings["dns"] = time.monotonic() - t0

    def _open_image_store(self) -> Path:
        """containerd's root: the image store kept between runs where one is set and no
        other node holds it (a lock held while this node runs), else the node's own."""
        own = self.workdir / "containerd" / "root"
        store = self.image_store
        if store is None:
            return own
        store.mkdir(parents=True, exist_ok=True)
        lock = open(store / "lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another node on this machine holds it
            lock.close()
            return own
        self._store_lock = lock
        version = subprocess.run(["containerd", "--version"], capture_output=True, text=True,
                                 env=dict(os.environ, PATH=_path())).stdout.strip()
        stamp, root = store / "containerd.version", store / "root"
        if (not stamp.exists() or stamp.read_text() != version
                or (root.is_dir() and oci.tree_size(root) > IMAGE_STORE_LIMIT)):
            shutil.rmtree(root, ignore_errors=True)
            stamp.write_text(version)
        return root

    def _remove_containers(self) -> None:
        """Removes every container (and its snapshot) from containerd's metadata: the
        image store keeps images only. The CRI plugin's directories of removed pods
        go with the next start (it removes those of containers it does not know).
        A store of the node's own goes with its work directory: its tasks are only
        killed."""
        self._kill_tasks()
        if self.root == self.workdir / "containerd" / "root":
            return
        try:
            for cid in self._ctr("containers", "ls", "-q").stdout.split():
                self._ctr("containers", "delete", cid)
        except (subprocess.TimeoutExpired, OSError):
            pass

    def has_image(self, archive: Path) -> bool:
        """Whether containerd holds the archive's images already (its manifests under
        their names): then an import only reads the archive."""
        try:
            wanted = set(oci.archive_images(archive))
            listed = self._ctr("images", "ls").stdout.splitlines()[1:]
        except (subprocess.TimeoutExpired, OSError, ValueError, KeyError):
            return False
        held = {(line.split()[0], line.split()[2]) for line in listed if len(line.split()) > 2}
        return wanted <= held

    def _containerd_up(self) -> bool:
        return subprocess.run(["ctr", "--address", str(self.socket), "version"],
                              capture_output=True, env=dict(os.environ, PATH=_path()),
                              timeout=10).returncode == 0

    def _write_cni_config(self) -> None:
        conf_dir = self.workdir / "cni" / "net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "10-rljob.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0",
            "name": CNI_NETWORK,
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                          "routes": [{"dst": "0.0.0.0/0"}],
                          "dataDir": str(self.workdir / "cni" / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }, indent=1))

    def _write_containerd_config(self) -> None:
        c = self.workdir / "containerd"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        (self.workdir / "containerd.toml").write_text(f"""version = 2
root = "{self.root or c / 'root'}"
state = "{c / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{self.socket}"

[{cri}]
  sandbox_image = "{self._image_ref('pause')}"
  # root here cannot lower oom_score_adj below 0 (no CAP_SYS_RESOURCE)
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{c / 'runc'}"

[{cri}.registry]
  # a registry's hosts.toml (its CA, what it serves) under certs.d/HOST:PORT/, read at
  # each pull (tests/cluster/registry.py writes one)
  config_path = "{self.registry_hosts}"

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{self.workdir / 'cni' / 'net.d'}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{c / 'opt'}"
""")

    @staticmethod
    def _image_ref(name: str) -> str:
        return f"rljob.local/{name}:test"

    # the images packed from a binary of bin_dir: (file in the image, image config)
    BINARY_IMAGES = {
        "pause": ("/pause", {"entrypoint": ["/pause"]}),
        "probe": ("/probe", {"entrypoint": ["/probe"]}),
        "coredns": ("/coredns", {"entrypoint": ["/coredns"]}),
        # the NetworkPolicy enforcer (tests/cluster/netpol.py)
        "kube-network-policies": ("/kube-network-policies",
                                  {"entrypoint": ["/kube-network-policies"]}),
        # Kueue's manager, as its release image runs it (/manager, a non-root user)
        "kueue": ("/manager", {"entrypoint": ["/manager"], "user": "65532:65532"}),
    }

    def _import_images(self) -> None:
        """Packs and imports the pause, probe and CoreDNS images."""
        for name in ("pause", "probe", "coredns"):
            self.import_binary_image(name)
        self._last_import = time.monotonic()

    def import_binary_image(self, name: str) -> str:
        """Packs (once per build of the binary and version of oci.py: the archives are
        cached next to the binaries) and imports the image of a binary of bin_dir
        (`BINARY_IMAGES`); returns its reference."""
        path, config = self.BINARY_IMAGES[name]
        packer = hashlib.sha256(Path(oci.__file__).read_bytes())
        binary = Path(os.path.realpath(self.bin_dir / name))
        ref = oci.normalize_name(self._image_ref(name))
        key = packer.copy()
        key.update(json.dumps([ref, path, config]).encode())
        archive = binary.parent.parent / "images" / f"{name}-{key.hexdigest()[:12]}.tar"
        if not archive.exists():
            rootfs = self.workdir / "rootfs" / name
            for d in ("etc", "tmp", "dev", "proc", "sys"):
                (rootfs / d).mkdir(parents=True, exist_ok=True)
            try:
                os.link(binary, rootfs / path.lstrip("/"))
            except OSError:
                shutil.copy2(binary, rootfs / path.lstrip("/"))
            oci.pack_rootfs(rootfs, ref, archive, config)
            shutil.rmtree(rootfs)
        if not self.has_image(archive):
            oci.import_archive(archive, self.socket)
        self.images[name] = ref
        self.archives[name] = archive
        return ref

    def _images_seen(self) -> bool:
        """Whether the kubelet lists the imported images (it reads them from the CRI
        plugin). An import that raced the CRI plugin's start once left the plugin
        without the pause image on a loaded machine, and every pod sandbox then failed;
        an image it does not list is imported again (an update the running plugin
        sees), at most every 10 s."""
        node = self.api_get(f"/api/v1/nodes/{self.name}")
        listed = {n for image in node["status"].get("images") or []
                  for n in image.get("names") or []}
        missing = [name for name, ref in self.images.items() if ref not in listed]
        if missing and time.monotonic() - self._last_import > 10:
            for name in missing:
                oci.import_archive(self.archives[name], self.socket)
            self._last_import = time.monotonic()
        return not missing

    def _start_node_components(self) -> None:
        plane, w = self.plane, self.workdir
        for identity in ("kubelet", "kube-proxy", "kube-scheduler"):
            plane.write_kubeconfig(w / f"{identity}.kubeconfig", identity)
        self.ports = {k: free_port() for k in ("kubelet", "kubelet-healthz", "scheduler",
                                                "proxy-healthz", "proxy-metrics")}

        self._spawn("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"),
            f"--kubeconfig={w / 'kube-scheduler.kubeconfig'}",
            f"--authentication-kubeconfig={w / 'kube-scheduler.kubeconfig'}",
            f"--authorization-kubeconfig={w / 'kube-scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['scheduler']}",
            "--leader-elect=false",
        ])

        (w / "kubelet.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": plane.node_ip,
            "port": self.ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.ports["kubelet-healthz"],
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(plane.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            # root here cannot lower oom_score_adj below 0
            "oomScoreAdj": 0,
            "clusterDNS": [self.dns_ip],
            "clusterDomain": "cluster.local",
            "resolvConf": "/etc/resolv.conf",
            # the imported images cannot be pulled again: never collect them
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # small disks: evict only when really full
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "nodefs.inodesFree": "1%", "imagefs.available": "1%",
                             "imagefs.inodesFree": "1%"},
            "evictionPressureTransitionPeriod": "10s",
            "makeIPTablesUtilChains": False,
            "podLogsDir": str(w / "pod-logs"),
            "volumePluginDir": str(w / "volume-plugins"),
            "serializeImagePulls": False,
            "shutdownGracePeriod": "0s",
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "20s",
            "registerNode": True,
            "maxPods": 50,
        }, indent=1))
        self._spawn("kubelet", [
            str(self.bin_dir / "kubelet"),
            f"--config={w / 'kubelet.yaml'}",
            f"--kubeconfig={w / 'kubelet.kubeconfig'}",
            f"--root-dir={w / 'kubelet'}",
            f"--cert-dir={w / 'kubelet' / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={plane.node_ip}",
            "--v=1",
        ])

        (w / "kube-proxy.yaml").write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(w / "kube-proxy.kubeconfig")},
            "mode": "iptables",
            "hostnameOverride": self.name,
            "bindAddress": plane.node_ip,
            "healthzBindAddress": f"127.0.0.1:{self.ports['proxy-healthz']}",
            "metricsBindAddress": f"127.0.0.1:{self.ports['proxy-metrics']}",
            "clusterCIDR": POD_CIDR,
            "detectLocalMode": "ClusterCIDR",
            "nodePortAddresses": ["primary"],
            "oomScoreAdj": 0,
            # write no sysctls: no conntrack table sizing or timeouts, no route_localnet
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s", "tcpBeLiberal": False,
                          "udpTimeout": "0s", "udpStreamTimeout": "0s"},
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False,
                         "syncPeriod": "30s", "minSyncPeriod": "0s"},
        }, indent=1))
        self._spawn("kube-proxy", [
            str(self.bin_dir / "kube-proxy"),
            f"--config={w / 'kube-proxy.yaml'}",
            "--v=1",
        ])

    def _proxy_healthy(self) -> bool:
        url = f"http://127.0.0.1:{self.ports['proxy-healthz']}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status == 200
        except urllib.error.HTTPError:
            return False

    def _dns_available(self) -> bool:
        dep = self.api_get("/apis/apps/v1/namespaces/kube-system/deployments/coredns")
        return dep.get("status", {}).get("availableReplicas", 0) >= 1

    # -- a power cut ---------------------------------------------------------

    def power_cut(self) -> list[int]:
        """What a power cut does to the node's processes, at once: every container
        process (those in the pods' cgroups), containerd's shims, containerd, the
        kubelet and kube-proxy get SIGKILL in one pass (a few milliseconds); nothing
        of theirs runs a handler or says goodbye to the API server. The
        kube-scheduler, the control plane's here, stays. The machine's kernel does not
        go down with them: files written (a Redis append-only file, a checkpoint) are
        kept as the page cache had them, and the pods' mounts and network namespaces
        stay for the kubelet and containerd to clean up as after a restart. Returns the
        pids the containers had."""
        cgroups = self._pod_cgroups()
        pids = sorted(self._pids_in(cgroups))
        node = [self.procs.pop(n) for n in ("kubelet", "kube-proxy", "containerd")
                if n in self.procs]
        for pid in [*pids, *self._shims(), *(-proc.pid for proc in node)]:
            _kill(pid)  # -pid: a node process's group (start_new_session)
        for proc in node:
            proc.wait()
        deadline = time.monotonic() + 10
        while left := self._pids_in(cgroups) | set(self._shims()):
            if time.monotonic() > deadline:  # a process forked during the pass
                raise RuntimeError(f"processes outlived the power cut: {sorted(left)}")
            for pid in left:
                _kill(pid)
            time.sleep(0.1)
        return pids

    def power_on(self, timeout: float = 180) -> float:
        """containerd, the kubelet and kube-proxy started again as they ran before
        `power_cut`; returns the seconds until the node reported Ready."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        self._spawn("containerd", self.argv["containerd"])
        self._wait("containerd", self._containerd_up, deadline - time.monotonic(), 0.2)
        self._spawn("kubelet", self.argv["kubelet"])
        self._spawn("kube-proxy", self.argv["kube-proxy"])
        self._wait("node Ready", self.node_ready, deadline - time.monotonic())
        return time.monotonic() - t0

    def _pod_cgroups(self) -> list[Path]:
        """The kubepods cgroups the node made (one per cgroup hierarchy)."""
        return [Path(d) / "kubepods" for d, had in self.before.cgroups.items() if not had]

    @staticmethod
    def _pids_in(cgroups: list[Path]) -> set[int]:
        pids: set[int] = set()
        for cg in cgroups:
            for dirpath, _, files in os.walk(cg):
                if "cgroup.procs" in files:
                    try:
                        pids |= {int(x) for x in
                                 (Path(dirpath) / "cgroup.procs").read_text().split()}
                    except OSError:
                        pass
        return pids

    # -- stop ----------------------------------------------------------------

    def stop(self) -> None:
        """Stops everything and removes what the node left on the machine.
        Idempotent; safe after a failed start."""
        if self.before is None:
            return
        t0 = time.monotonic()
        if "kubelet" in self.procs and self.procs["kubelet"].poll() is None:
            self._drain_pods()
        for name in ("kube-scheduler", "kube-proxy", "kubelet"):
            self._stop_proc(name)
        if "containerd" in self.procs:
            self._remove_containers()
        self._stop_proc("containerd")
        self.procs.clear()
        self._sweep()
        if self._store_lock is not None:
            self._store_lock.close()  # the image store's lock
            self._store_lock = None
        self.before = None
        self.timings["teardown"] = time.monotonic() - t0

    def _drain_pods(self) -> None:
        """Deletes every pod through the API and waits for the kubelet to finish them
        (containers stopped, sandboxes' networks torn down, volumes unmounted)."""
        self._stop_proc("kube-scheduler")  # no new pods land on the node meanwhile
        self.plane.kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=1",
                           "--wait=true", "--timeout=60s", check=False, timeout=90)

    def _ctr(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(["ctr", "--address", str(self.socket), "--namespace", "k8s.io",
                               *args], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, PATH=_path()))

    def _kill_tasks(self) -> None:
        """Kills and removes the container processes containerd still runs."""
        try:
            running = self._ctr("tasks", "ls", "-q").stdout.split()
            for cid in running:
                self._ctr("tasks", "kill", "--signal", "SIGKILL", cid)
            for cid in running:
                self._ctr("tasks", "delete", "--force", cid)
        except (subprocess.TimeoutExpired, OSError):
            pass

    def _sweep(self) -> None:
        before = self.before
        env = dict(os.environ, PATH=_path())

        def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
            return subprocess.run(list(args), capture_output=True, text=True, env=env,
                                  input=input, timeout=60)

        # processes: the pods' (kubepods cgroups) and containerd's shims
        new_cgroups = self._pod_cgroups()
        for _ in range(20):
            pids = self._pids_in(new_cgroups) | set(self._shims())
            if not pids:
                break
            for pid in pids:
                _kill(pid)
            time.sleep(0.2)

        # mounts under our directories and the network namespaces made for pods
        prefixes = [str(self.workdir) + "/"]
        prefixes += [p + "/" for p, had in before.paths.items() if not had]
        new_netns = netns_entries() - before.netns
        prefixes += [str(NETNS_DIR / n) for n in new_netns]
        for _ in range(3):
            mounts = [m for m in _mount_points()
                      if any(m == p.rstrip("/") or m.startswith(p) for p in prefixes)]
            if not mounts:
                break
            for m in sorted(mounts, key=len, reverse=True):
                run("umount", "-l", m)
        for n in new_netns:
            try:
                (NETNS_DIR / n).unlink()
            except OSError:
                pass

        # the NetworkPolicy enforcer's table, if it could not remove it (netpol.py)
        from tests.cluster.netpol import remove_table

        remove_table()
        # network: veths on the bridge (if any pod netns survived) and the bridge
        if BRIDGE not in before.links and BRIDGE in links():
            brif = Path("/sys/class/net") / BRIDGE / "brif"
            for veth in (os.listdir(brif) if brif.is_dir() else []):
                run("ip", "link", "delete", veth)
            run("ip", "link", "delete", BRIDGE)
        for family in ("iptables", "ip6tables"):
            self._sweep_iptables(family, before.our_chains(family))
        for flt in (["-s", POD_CIDR], ["-d", POD_CIDR], ["-d", self.plane.service_cidr]):
            run("conntrack", "-D", *flt)

        # sysctls
        for name, value in before.sysctls.items():
            if value is not None and read_sysctls((name,))[name] != value:
                try:
                    write_sysctl(name, value)
                except OSError:
                    pass

        # cgroups, leaves first
        for cg in new_cgroups:
            for _ in range(10):
                if not cg.exists():
                    break
                for dirpath, _, _ in sorted(os.walk(cg), key=lambda e: -len(e[0])):
                    try:
                        os.rmdir(dirpath)
                    except OSError:
                        pass
                if cg.exists():
                    time.sleep(0.2)

        # files
        for p, had in before.paths.items():
            path = Path(p)
            if not had:
                shutil.rmtree(path, ignore_errors=True)
            elif path == Path("/var/log/containers") and path.is_dir():
                for entry in path.iterdir():  # the kubelet's links to our pod logs
                    if entry.is_symlink() and os.readlink(entry).startswith(str(self.workdir)):
                        entry.unlink()
        results = Path("/var/lib/cni/results")
        if before.paths.get("/var/lib/cni") and results.is_dir():
            for entry in results.glob(f"{CNI_NETWORK}-*"):
                entry.unlink()
        if not os.environ.get("RLJOB_KEEP_CLUSTER_DIR"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _shims(self) -> list[int]:
        pids = []
        needle = str(self.socket).encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline.split(b"\0")[0] and needle in cmdline:
                pids.append(int(entry))
        return pids

    @staticmethod
    def _sweep_iptables(family: str, chains: dict[str, set[str]]) -> None:
        """Removes the given chains and every rule that jumps to them, per table, in
        one iptables-restore transaction each."""
        env = dict(os.environ, PATH=_path())
        tables = {t: cs for t, cs in chains.items() if cs}
        if not tables:
            return
        dump = subprocess.run([f"{family}-save"], capture_output=True, text=True,
                              env=env).stdout
        rules: dict[str, list[str]] = {}
        table = ""
        for line in dump.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith("-A ") and table in tables:
                parts = line.split()
                target = ""
                for flag in ("-j", "-g"):
                    if flag in parts[:-1]:
                        target = parts[parts.index(flag) + 1]
                if parts[1] not in tables[table] and target in tables[table]:
                    rules.setdefault(table, []).append("-D " + line[3:])
        script = []
        for t, cs in tables.items():
            script.append(f"*{t}")
            script += rules.get(t, [])
            script += [f"-F {c}" for c in sorted(cs)]
            script += [f"-X {c}" for c in sorted(cs)]
            script.append("COMMIT")
        proc = subprocess.run([f"{family}-restore", "--noflush"], input="\n".join(script) + "\n",
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            # one bad line fails the whole transaction: fall back to one command each
            for t, cs in tables.items():
                for rule in rules.get(t, []):
                    subprocess.run([family, "-t", t, *shlex.split(rule)], capture_output=True,
                                   env=env)
                for c in sorted(cs):
                    subprocess.run([family, "-t", t, "-F", c], capture_output=True, env=env)
                for c in sorted(cs):
                    subprocess.run([family, "-t", t, "-X", c], capture_output=True, env=env)


def _kill(pid: int) -> None:
    """SIGKILL to a process (a process group: -pgid), gone or not."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            # the mount point is field 5, with spaces and the like octal-escaped
            point = line.split()[4]
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point))
    return points
