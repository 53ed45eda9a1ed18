"""Builds rljob's CPU container images without a container engine, as OCI image archives
that ``python -m images.push`` pushes to a registry and ``ctr -n k8s.io images import``
loads into one node's containerd.

    sudo python -m images.build [runtime] [operator] [--verify] [--rebuild]

prints one line per image, ``REFERENCE ARCHIVE``, on stdout (progress goes to stderr):

    docker.io/rljob/runtime:0.1.0-cpu  ~/.cache/rljob/images/runtime.<key>/runtime.oci.tar
    docker.io/rljob/operator:0.1.0     ~/.cache/rljob/images/operator.<key>/operator.oci.tar

Stages, each cached under ``~/.cache/rljob/images/<stage>.<key>`` (``$RLJOB_IMAGES_CACHE``)
with the key a hash of its inputs, so a run with nothing changed only prints the paths:

    base      debootstrap --variant=minbase of a Debian suite + python3 (shared)
    wheel     ``pip wheel --no-deps`` of the repository (key: its sources)
    NAME-deps base + the image's Debian packages and user + a venv with rljob's
              dependencies (images/install.py, the Dockerfiles' definition too)
    NAME      NAME-deps (hard links) + the rljob wheel (+ examples), checked in a
              chroot, packed as a one-layer OCI archive (images/oci.py)

A change to the code rebuilds the last stage only. Needs root (debootstrap, chroot,
mounts), the Debian mirror and PyPI; downloaded .debs and wheels are cached too
(``debs/``, ``wheelhouse/``: delete them to reclaim the space).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from images import oci
else:
    from . import oci

REPO = Path(__file__).resolve().parents[1]
IMAGES_DIR = REPO / "images"
LOCK = REPO / "locks" / "test.txt"  # the versions the CPU and operator images install
VENV = "/opt/rljob/venv"
BUILD_DIR = "/tmp/rljob-build"      # wheel + install.py while installing, then removed
WHEELHOUSE = "/tmp/rljob-wheelhouse"  # the host's wheel cache, bind-mounted while installing
CA_FILE = f"{BUILD_DIR}/ca.crt"     # the host's CA bundle while downloading, then removed
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# bump when a stage's steps change in a way its inputs do not show
# an image of two layers (its deps' layer, reused, and what NAME adds): image 2
STAGE_FORMAT = {"base": 1, "deps": 1, "image": 2}
CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

TORCH_CHECK = """\
import torch
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
x, y = torch.randn(32, 8), torch.randn(32, 1)
losses = []
for _ in range(5):
    loss = torch.nn.functional.mse_loss(m(x), y)
    opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
assert losses[-1] < losses[0], losses
assert not torch.cuda.is_available() and torch.distributed.is_gloo_available()
print("torch", torch.__version__, "forward/backward on CPU ok, loss", losses[0], "->", losses[-1])
"""
# a storage unit's redis-server (on a unix socket: the chroot shares the host's network)
REDIS_CHECK = """\
set -e
d=$(mktemp -d)
trap 'redis-cli -s "$d/s" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$d"' EXIT
redis-server --port 0 --unixsocket "$d/s" --save "" --appendonly yes --dir "$d" \\
    --daemonize yes --pidfile "$d/pid" --logfile "$d/log"
for _ in $(seq 50); do redis-cli -s "$d/s" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
redis-cli -s "$d/s" set k v >/dev/null
test "$(redis-cli -s "$d/s" get k)" = v
echo "redis-server $(redis-server --version | cut -d' ' -f3) serves as uid $(id -u)"
"""
# rollout.mcpServers in a pod: the shipped MCP server (stdio) started, listed and called
MCP_CHECK = """\
from rljob.api.spec.workers import McpServerSpec
from rljob.tools.mcp import close_all, server_for
server = server_for(McpServerSpec(name="table", command=["python", "tools/table_server.py"]))
tools = {t.name: t for t in server.tools()}
result = tools["lookup"]({"city": "Avalon"})
assert result.ok and result.output == "89", result
close_all()
print("the MCP server tools/table_server.py lists", sorted(tools), "and answers", result.output)
"""
OPERATOR_IMPORTS = """\
import importlib, pkgutil, sys, rljob_operator
for m in pkgutil.iter_modules(rljob_operator.__path__):
    importlib.import_module("rljob_operator." + m.name)
heavy = sorted({"torch", "transformers", "matplotlib", "pyarrow"} & set(sys.modules))
assert not heavy, heavy
print("every rljob_operator module imports")
"""


@dataclass(frozen=True)
class Image:
    name: str
    tags: tuple[str, ...]
    flavor: str                       # images/install.py flavor
    uid: int
    user: str = "rljob"
    home: str | None = None           # None: no home directory
    apt: tuple[str, ...] = ()
    examples: bool = False            # examples/ -> /opt/rljob/examples
    entrypoint: tuple[str, ...] = ()
    workdir: str = "/"
    env: tuple[tuple[str, str], ...] = ()
    exposed_ports: tuple[int, ...] = ()
    checks: tuple[tuple[str, ...], ...] = field(default=(), compare=False)

    def image_env(self) -> dict[str, str]:
        return {"PATH": f"{VENV}/bin:{CHROOT_PATH}", "LANG": "C.UTF-8",
                "PYTHONUNBUFFERED": "1", **dict(self.env)}

    def oci_config(self) -> dict:
        return {"entrypoint": list(self.entrypoint), "env": self.image_env(),
                "user": f"{self.uid}:{self.uid}", "workdir": self.workdir,
                "exposed_ports": list(self.exposed_ports),
                "labels": {"org.opencontainers.image.title": f"rljob {self.name}",
                           "org.opencontainers.image.version": project_version()},
                "history": "images/build.py"}


def project_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def images(version: str) -> dict[str, Image]:
    """The images and the names pods use: the RLJob spec's ``image`` defaults to
    rljob/runtime:VERSION (the accelerator image), so CPU jobs name this one; the Helm
    chart runs rljob/operator:APPVERSION."""
    return {
        "runtime": Image(
            name="runtime", tags=(f"rljob/runtime:{version}-cpu",), flavor="cpu",
            # the pods' user on CPU (rljob.api.builders._non_root_pod), with a home for caches
            uid=1000, home="/home/rljob",
            # storage-unit pods can run this image too (transferQueue.redis.image)
            apt=("redis-server",), examples=True,
            entrypoint=("rljob",), workdir="/opt/rljob/examples",
            checks=(("rljob", "--help"), ("rljob", "worker", "--help"),
                    ("rljob", "validate", "quickstart.yaml"),
                    ("python", "-c", TORCH_CHECK),
                    ("python", "-c", "import transformers, matplotlib, pyarrow, grpc, redis; "
                     "print('runtime imports ok')"),
                    ("redis-server", "--version"), ("sh", "-c", REDIS_CHECK),
                    ("python", "-c", MCP_CHECK))),
        "operator": Image(
            name="operator", tags=(f"rljob/operator:{version}",), flavor="operator",
            uid=10001, entrypoint=("rljob-operator",), exposed_ports=(8080, 9090),
            checks=(("rljob-operator", "--help"), ("python", "-c", OPERATOR_IMPORTS))),
    }


# ---- small helpers -------------------------------------------------------------

def log(msg: str) -> None:
    print(f"[images {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    log("$ " + " ".join(map(str, cmd)))
    kw.setdefault("stdout", sys.stderr)  # stdout carries the result only
    return subprocess.run(list(map(str, cmd)), check=True, **kw)


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def hash_tree(*paths: Path) -> str:
    """Hash of the names, modes and contents of the files under paths (no caches)."""
    h = hashlib.sha256()
    for top in paths:
        files = [top] if top.is_file() else sorted(
            p for p in top.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
            and not any(part.endswith(".egg-info") for part in p.parts) and p.suffix != ".pyc")
        for p in files:
            h.update(f"{p.relative_to(REPO)}\0{p.stat().st_mode & 0o777}\0".encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def newest_mtime(root: Path) -> int:
    """The newest modification time (ns) of anything under root, the root too."""
    newest = root.lstat().st_mtime_ns
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime_ns)
    return newest


def lower_written(deps: "Stage") -> int:
    """The newest modification time of the deps tree when its layer was written."""
    return json.loads((deps.dir / "layer.json").read_text())["mtime_ns"]


def mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()).rstrip("/") + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    return [p for p in points if (p + "/").startswith(prefix)]


def rmtree(path: Path) -> None:
    """rm -rf that refuses to go through a mount point (a bind-mounted cache)."""
    if not path.exists() and not path.is_symlink():
        return
    if left := mounts_under(path):
        raise RuntimeError(f"refusing to remove {path}: still mounted: {left}")
    shutil.rmtree(path)


def du(path: Path) -> int:
    return oci.tree_size(path)


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def host_ca_bundle() -> Path | None:
    for cand in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                 "/etc/ssl/certs/ca-certificates.crt"):
        if cand and Path(cand).is_file():
            return Path(cand)
    return None


# ---- the chroot ---------------------------------------------------------------

class Chroot:
    """A root filesystem being built: /proc mounted, and while `network` the host's
    resolv.conf, CA bundle and wheel cache, all undone on exit."""

    def __init__(self, root: Path, wheelhouse: Path | None = None, network: bool = False):
        self.root, self.wheelhouse, self.network = root, wheelhouse, network
        self._mounted: list[Path] = []

    def __enter__(self) -> "Chroot":
        try:
            self._mount(["-t", "proc", "proc"], self.root / "proc")
            if self.network:
                self.replace_file("etc/resolv.conf", Path("/etc/resolv.conf").read_bytes())
                (self.root / BUILD_DIR[1:]).mkdir(parents=True, exist_ok=True)
                if ca := host_ca_bundle():
                    shutil.copyfile(ca, self.root / CA_FILE[1:])
                if self.wheelhouse:
                    self.wheelhouse.mkdir(parents=True, exist_ok=True)
                    (self.root / WHEELHOUSE[1:]).mkdir(parents=True, exist_ok=True)
                    self._mount(["--bind", self.wheelhouse], self.root / WHEELHOUSE[1:])
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _mount(self, args, target: Path) -> None:
        run(["mount", *args, target])
        self._mounted.append(target)

    def __exit__(self, *exc) -> None:
        errors = []
        for target in reversed(self._mounted):
            proc = subprocess.run(["umount", target], capture_output=True, text=True)
            if proc.returncode:
                proc = subprocess.run(["umount", "-l", target], capture_output=True, text=True)
            if proc.returncode:
                errors.append(f"{target}: {proc.stderr.strip()}")
        self._mounted.clear()
        if self.network:
            with contextlib.suppress(OSError):
                (self.root / WHEELHOUSE[1:]).rmdir()
            with contextlib.suppress(FileNotFoundError):
                (self.root / CA_FILE[1:]).unlink()
            self.replace_file("etc/resolv.conf", b"")  # the container runtime provides it
        if errors:
            raise RuntimeError("could not unmount " + "; ".join(errors))

    def replace_file(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        """Writes a new file (never into the old inode: it may be a hard link)."""
        path = self.root / rel
        path.unlink(missing_ok=True)
        path.write_bytes(data)
        path.chmod(mode)

    def env(self, image: Image | None = None, home: str = "/root") -> dict[str, str]:
        env = image.image_env() if image else {"PATH": CHROOT_PATH, "LANG": "C.UTF-8"}
        env.update(HOME=home, DEBIAN_FRONTEND="noninteractive")
        if self.network:
            # downloads are kept in the wheelhouse (pip's HTTP cache obeys the
            # servers' no-store, and would land in the image)
            env.update(PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                       PIP_ROOT_USER_ACTION="ignore", PIP_DEFAULT_TIMEOUT="180")
            if (self.root / CA_FILE[1:]).exists():
                env.update(PIP_CERT=CA_FILE, SSL_CERT_FILE=CA_FILE)
            for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST",
                      "http_proxy", "https_proxy", "no_proxy",
                      "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
                if k in os.environ:
                    env[k] = os.environ[k]
        return env

    def run(self, *cmd: str, image: Image | None = None, user: int | None = None,
            cwd: str = "/", capture: bool = False) -> subprocess.CompletedProcess:
        home = "/root"
        if image is not None and user is not None:
            home = image.home or "/"
        spec = [f"--userspec={user}:{user}"] if user is not None else []
        full = ["chroot", *spec, self.root, "/usr/bin/env", "-C", cwd, *cmd]
        shown = " ".join(a if "\n" not in a else "<script>" for a in cmd)
        log(f"chroot{' as ' + str(user) if user is not None else ''}: {shown[:200]}")
        if capture:
            return subprocess.run(full, check=True, env=self.env(image, home),
                                  capture_output=True, text=True)
        return subprocess.run(full, check=True, env=self.env(image, home), stdout=sys.stderr)


def trim(root: Path) -> None:
    """What a container never reads: documentation (the copyright files stay), man
    pages, locales, apt lists and caches, logs, temporary files."""
    doc = root / "usr/share/doc"
    if doc.is_dir():
        for p in sorted(doc.rglob("*"), reverse=True):
            if p.is_file() or p.is_symlink():
                if p.name != "copyright":
                    p.unlink()
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()
    for rel in ("usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/locale",
                "var/lib/apt/lists", "var/cache/apt", "var/cache/debconf", "var/log",
                "root/.cache", "tmp"):
        d = root / rel
        if d.is_dir():
            for p in d.iterdir():
                if p.is_dir() and not p.is_symlink():
                    rmtree(p)
                else:
                    p.unlink()
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    for p in (root / "var/lib/dpkg").glob("*-old"):
        p.unlink()


# ---- stages ---------------------------------------------------------------------

@dataclass
class Stage:
    kind: str
    key: str
    dir: Path
    built: bool = False
    seconds: float = 0.0
    info: dict = field(default_factory=dict)

    @property
    def rootfs(self) -> Path:
        return self.dir / "rootfs"


class Builder:
    def __init__(self, cache: Path, suite: str = "bookworm", mirror: str = DEFAULT_MIRROR,
                 security_mirror: str = DEFAULT_SECURITY_MIRROR, rebuild: bool = False):
        self.cache = cache
        self.suite, self.mirror, self.security_mirror = suite, mirror, security_mirror
        self.rebuild = rebuild
        self.version = project_version()
        self.stages: list[Stage] = []

    # a stage is built into DIR.partial and renamed when complete: a DIR is always whole
    def _stage(self, kind: str, inputs: dict, build) -> Stage:
        key = digest({"kind": kind, **inputs})
        stage = Stage(kind, key, self.cache / f"{kind}.{key}")
        done = stage.dir / "stage.json"
        if done.exists() and not (self.rebuild and kind not in ("base", "wheel")):
            stage.info = json.loads(done.read_text())
            stage.seconds = stage.info.get("seconds", 0.0)
            self.stages.append(stage)
            return stage
        partial = stage.dir.with_name(stage.dir.name + ".partial")
        rmtree(partial)
        partial.mkdir(parents=True)
        log(f"building {kind} ({key})")
        t = time.monotonic()
        try:
            stage.info = build(Stage(kind, key, partial)) or {}
        except BaseException:
            if not mounts_under(partial):
                rmtree(partial)
            raise
        stage.seconds = round(time.monotonic() - t, 1)
        stage.info.update(seconds=stage.seconds, inputs=inputs, key=key)
        (partial / "stage.json").write_text(json.dumps(stage.info, indent=2, default=str))
        rmtree(stage.dir)
        partial.rename(stage.dir)
        stage.built = True
        self.stages.append(stage)
        log(f"{kind} built in {stage.seconds:.0f} s")
        self._collect(kind, stage.dir)
        return stage

    def _collect(self, kind: str, keep: Path) -> None:
        """Removes the other builds of this stage kind (one of each is kept)."""
        for old in self.cache.glob(f"{kind}.*"):
            name = old.name
            if old != keep and name.rsplit(".", 1)[0] == kind and not name.endswith(".lock"):
                log(f"removing the previous {kind} build {old.name}")
                rmtree(old)

    # -- base: Debian minbase + python3 ----------------------------------------------
    def base(self) -> Stage:
        inputs = {"format": STAGE_FORMAT["base"], "suite": self.suite, "mirror": self.mirror,
                  "security": self.security_mirror, "variant": "minbase",
                  "packages": BASE_PACKAGES}
        return self._stage("base", inputs, self._build_base)

    def _build_base(self, stage: Stage) -> dict:
        if not shutil.which("debootstrap"):
            run(["apt-get", "update", "-qq"])
            run(["apt-get", "install", "-y", "-qq", "debootstrap"],
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        debs = self.cache / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        root = stage.rootfs
        t = time.monotonic()
        run(["debootstrap", "--variant=minbase", f"--cache-dir={debs}",
             f"--include={','.join(BASE_PACKAGES)}", self.suite, root, self.mirror],
            stdout=subprocess.DEVNULL)
        t_debootstrap = time.monotonic() - t
        ch = Chroot(root, network=True)
        ch.replace_file("etc/apt/sources.list", (
            f"deb {self.mirror} {self.suite} main\n"
            f"deb {self.mirror} {self.suite}-updates main\n"
            f"deb {self.security_mirror} {self.suite}-security main\n").encode())
        ch.replace_file("etc/hostname", b"localhost\n")  # the build host's name otherwise
        # packages must not start services in the build
        ch.replace_file("usr/sbin/policy-rc.d", b"#!/bin/sh\nexit 101\n", 0o755)
        ch.replace_file("etc/apt/apt.conf.d/90rljob", (
            'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n'
            'Acquire::Languages "none";\nDpkg::Use-Pty "0";\n').encode())
        ch.replace_file("etc/dpkg/dpkg.cfg.d/90rljob", (
            "path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\n"
            "path-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\n"
            "path-exclude /usr/share/locale/*\n").encode())
        with ch:
            ch.run("apt-get", "update", "-qq")
            ch.run("apt-get", "dist-upgrade", "-y", "-qq")
            ch.run("apt-get", "clean")
        trim(root)
        return {"debootstrap_seconds": round(t_debootstrap, 1), "rootfs_bytes": du(root)}

    # -- wheel ----------------------------------------------------------------------
    def wheel(self) -> Stage:
        sources = [REPO / "pyproject.toml", REPO / "README.md", REPO / "runtime",
                   REPO / "operator"]
        return self._stage("wheel", {"sources": hash_tree(*sources)}, self._build_wheel)

    def _build_wheel(self, stage: Stage) -> dict:
        src = stage.dir / "src"
        src.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
        for rel in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / rel, src / rel)
        for rel in ("runtime", "operator"):
            shutil.copytree(REPO / rel, src / rel, ignore=ignore)
        env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}
        run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
             "--disable-pip-version-check", "--wheel-dir", stage.dir, f"{src}/"], env=env)
        rmtree(src)
        wheels = sorted(stage.dir.glob("rljob-*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"expected one rljob wheel, got {wheels}")
        return {"wheel": wheels[0].name}

    # -- NAME-deps: packages, user, venv with the dependencies -----------------------
    def deps(self, image: Image, base: Stage, wheel: Stage) -> Stage:
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        inputs = {"format": STAGE_FORMAT["deps"], "base": base.key, "apt": image.apt,
                  "user": [image.user, image.uid, image.home], "flavor": image.flavor,
                  "install.py": hash_tree(IMAGES_DIR / "install.py"),
                  "lock": hash_tree(LOCK),
                  "requires": [project.get("dependencies", []),
                               project.get("optional-dependencies", {})]}
        return self._stage(f"{image.name}-deps", inputs,
                           lambda s: self._build_deps(s, image, base, wheel))

    def _build_deps(self, stage: Stage, image: Image, base: Stage, wheel: Stage) -> dict:
        root, times = stage.rootfs, {}
        t = time.monotonic()
        run(["cp", "-a", base.rootfs, root])
        times["copy_base"] = time.monotonic() - t
        with Chroot(root, wheelhouse=self.cache / "wheelhouse", network=True) as ch:
            if image.apt:
                t = time.monotonic()
                ch.run("apt-get", "update", "-qq")
                ch.run("apt-get", "install", "-y", "-qq", *image.apt)
                ch.run("apt-get", "clean")
                times["apt"] = time.monotonic() - t
            home = ["--create-home", "--home-dir", image.home] if image.home else [
                "--no-create-home", "--home-dir", "/nonexistent"]
            ch.run("groupadd", "--gid", str(image.uid), image.user)
            ch.run("useradd", "--uid", str(image.uid), "--gid", str(image.uid), *home,
                   "--shell", "/usr/sbin/nologin", image.user)
            t = time.monotonic()
            ch.run("python3", "-m", "venv", VENV)
            ch.run(f"{VENV}/bin/python", "-m", "pip", "install", "--quiet", "--upgrade", "pip")
            shutil.copy2(IMAGES_DIR / "install.py", root / BUILD_DIR[1:] / "install.py")
            shutil.copy2(LOCK, root / BUILD_DIR[1:] / "lock.txt")
            shutil.copy2(wheel.dir / wheel.info["wheel"], root / BUILD_DIR[1:])
            ch.run(f"{VENV}/bin/python", f"{BUILD_DIR}/install.py", image.flavor,
                   "--find-links", BUILD_DIR, "--version", self.version, "--only", "deps",
                   "--wheelhouse", WHEELHOUSE, "--constraint", f"{BUILD_DIR}/lock.txt")
            times["pip"] = time.monotonic() - t
        rmtree(root / BUILD_DIR[1:])
        trim(root)
        return {"step_seconds": {k: round(v, 1) for k, v in times.items()},
                "rootfs_bytes": du(root)}

    # -- NAME: the wheel, examples, checks, the archive ------------------------------
    def image(self, image: Image, deps: Stage, wheel: Stage, verify: bool = True) -> Stage:
        inputs = {"format": STAGE_FORMAT["image"], "deps": deps.key, "wheel": wheel.key,
                  "examples": hash_tree(REPO / "examples") if image.examples else None,
                  "tags": image.tags, "config": image.oci_config(),
                  "oci.py": hash_tree(IMAGES_DIR / "oci.py")}
        return self._stage(image.name, inputs,
                           lambda s: self._build_image(s, image, deps, wheel, verify))

    def _build_image(self, stage: Stage, image: Image, deps: Stage, wheel: Stage,
                     verify: bool) -> dict:
        root, times = stage.rootfs, {}
        t = time.monotonic()
        # hard links: what follows only adds files (pip, examples) or removes them
        run(["cp", "-al", deps.rootfs, root])
        build = root / BUILD_DIR[1:]
        build.mkdir(parents=True)
        shutil.copy2(IMAGES_DIR / "install.py", build / "install.py")
        shutil.copy2(wheel.dir / wheel.info["wheel"], build)
        with Chroot(root) as ch:
            ch.run(f"{VENV}/bin/python", f"{BUILD_DIR}/install.py", image.flavor,
                   "--find-links", BUILD_DIR, "--version", self.version, "--only", "app")
        rmtree(build)
        if image.examples:
            shutil.copytree(REPO / "examples", root / "opt/rljob/examples",
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (root / image.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        times["install_app"] = time.monotonic() - t
        rootfs_bytes = du(root)
        t = time.monotonic()
        archive = stage.dir / f"{image.name}.oci.tar"
        lower = self.deps_layer(deps)
        times["deps_layer"] = time.monotonic() - t
        t = time.monotonic()
        # two layers: the deps' (the same blob while they do not change: a node or a
        # registry that holds it takes only the second), and what the app added
        packed = oci.pack_layers([lower, oci.Layer(root, deps.rootfs)], list(image.tags),
                                 archive, image.oci_config())
        if newest_mtime(deps.rootfs) > lower_written(deps):
            raise RuntimeError(f"{deps.rootfs} changed after its layer was written (a file "
                               "of it written in place through a hard link)")
        times["pack"] = time.monotonic() - t
        t = time.monotonic()
        oci.verify_archive(archive)
        times["verify_archive"] = time.monotonic() - t
        # after packing: what the checks write (caches in the home directory) stays out
        checks = []
        if verify:
            t = time.monotonic()
            checks = self.check(image, root)
            times["checks"] = time.monotonic() - t
        return {"step_seconds": {k: round(v, 1) for k, v in times.items()},
                "rootfs_bytes": rootfs_bytes, "archive": archive.name,
                "archive_bytes": archive.stat().st_size, "names": packed["names"],
                "manifest": packed["manifest"], "checks": checks}

    def deps_layer(self, deps: Stage) -> oci.Layer:
        """The deps stage's tree as a layer blob, written the first time an image asks
        for it and kept in the stage (a stage's tree never changes after it is built)."""
        blob, meta = deps.dir / "layer.tar", deps.dir / "layer.json"
        if blob.exists() and meta.exists():
            info = json.loads(meta.read_text())
            return oci.Layer(blob=blob, digest=info["digest"], size=info["size"])
        log(f"writing the layer of {deps.dir.name}")
        layer = oci.write_layer(deps.rootfs, blob)
        meta.write_text(json.dumps({"digest": layer.digest, "size": layer.size,
                                    "mtime_ns": newest_mtime(deps.rootfs)}))
        return layer

    def check(self, image: Image, root: Path) -> list[dict]:
        """Runs the image's checks in a chroot as the image's user, from its workdir."""
        out = []
        with Chroot(root) as ch:
            for cmd in image.checks:
                t = time.monotonic()
                try:
                    proc = ch.run(*cmd, image=image, user=image.uid, cwd=image.workdir,
                                  capture=True)
                except subprocess.CalledProcessError as e:
                    log(f"  FAILED: {' '.join(cmd)[:200]}\n{e.stdout}{e.stderr}")
                    raise
                if proc.stderr.strip():
                    log("  stderr: " + proc.stderr.strip().replace("\n", "\n  stderr: ")[-2000:])
                first = (proc.stdout.strip().splitlines() or [""])[0].strip()
                log(f"  ok ({time.monotonic() - t:.1f} s): {first[:160]}")
                out.append({"cmd": " ".join(cmd)[:80], "seconds": round(time.monotonic() - t, 1),
                            "output": first[:200]})
        return out

    def build(self, names: list[str], verify: bool = True, recheck: bool = False
              ) -> list[tuple[Image, Stage]]:
        specs = images(self.version)
        base = self.base()
        wheel = self.wheel()
        result = []
        for name in names:
            image = specs[name]
            deps = self.deps(image, base, wheel)
            final = self.image(image, deps, wheel, verify)
            if recheck and not final.built:
                self.check(image, final.rootfs)
            result.append((image, final))
        return result


def summary(builder: Builder) -> str:
    lines = []
    for s in builder.stages:
        state = "built" if s.built else "cached"
        sizes = ""
        if "rootfs_bytes" in s.info:
            sizes += f", rootfs {mib(s.info['rootfs_bytes'])}"
        if "archive_bytes" in s.info:
            sizes += f", archive {mib(s.info['archive_bytes'])}"
        steps = s.info.get("step_seconds", {})
        if "debootstrap_seconds" in s.info:
            steps = {"debootstrap": s.info["debootstrap_seconds"], **steps}
        detail = (" (" + ", ".join(f"{k} {v:.0f} s" for k, v in steps.items()) + ")"
                  if steps else "")
        lines.append(f"  {s.kind:<14} {state:<6} {s.seconds:7.1f} s{detail}{sizes}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    specs = images(project_version())
    ap = argparse.ArgumentParser(
        prog="python -m images.build",
        description="Build rljob's CPU images as OCI archives without a container engine.")
    ap.add_argument("images", nargs="*", metavar="IMAGE",
                    help=f"which images (default: all of {', '.join(specs)})")
    ap.add_argument("--cache", type=Path,
                    default=Path(os.environ.get("RLJOB_IMAGES_CACHE",
                                                Path.home() / ".cache/rljob/images")))
    ap.add_argument("--suite", default="bookworm")
    ap.add_argument("--mirror", default=DEFAULT_MIRROR)
    ap.add_argument("--security-mirror", default=DEFAULT_SECURITY_MIRROR)
    ap.add_argument("--rebuild", action="store_true",
                    help="rebuild the images' stages (not the Debian base or the wheel)")
    ap.add_argument("--verify", action="store_true",
                    help="run the checks in a chroot again even if nothing was rebuilt")
    ap.add_argument("--no-checks", action="store_true",
                    help="do not run the checks in a chroot when building")
    args = ap.parse_args(argv)
    names = args.images or list(specs)
    if unknown := sorted(set(names) - set(specs)):
        ap.error(f"unknown images {unknown}; choose from {', '.join(specs)}")
    if os.geteuid() != 0:
        ap.error("needs root (debootstrap, chroot, mount)")
    args.cache.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    with open(args.cache / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        builder = Builder(args.cache.resolve(), args.suite, args.mirror, args.security_mirror,
                          args.rebuild)
        built = builder.build(names, verify=not args.no_checks, recheck=args.verify)
    log(f"done in {time.monotonic() - t:.1f} s\n{summary(builder)}")
    for image, stage in built:
        for ref in stage.info["names"]:
            print(f"{ref} {stage.dir / stage.info['archive']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
