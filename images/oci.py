"""OCI image archives from root filesystem directories (no registry, no daemon).

An archive is a tar of an OCI image layout (``oci-layout``, ``index.json``,
``blobs/sha256/...``): ``ctr -n k8s.io images import ARCHIVE`` names the image after
the ``io.containerd.image.name`` annotation of each ``index.json`` entry, verbatim,
so the names written here are normalized the way the kubelet asks for them
(``rljob/runtime:0.1.0-cpu`` -> ``docker.io/rljob/runtime:0.1.0-cpu``).

A layer keeps owners, modes and times of the tree (a Debian root filesystem has
files that belong to other users than root); it is written in two passes, the first
only to learn its digest and size, so a multi-gigabyte layer is never staged on disk.
An image has one layer (`pack_rootfs`) or several (`pack_layers`): a layer may be a
tree whole, what a tree adds to and removes from the tree below it (its files that are
not the lower tree's by inode: a tree made with `cp -al` of the lower one and then
added to; the removed as whiteouts), or a layer blob written before (`write_layer`),
so an image whose lower tree did not change reuses its layer, and a node or registry
that holds it already takes only the new one. Pure Python: tarfile, hashlib, json.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
LAYER_GZIP_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# kept as empty directories: the container runtime mounts its own
EMPTY_DIRS = ("dev", "proc", "sys")

# pack_rootfs config keys -> OCI image config fields
_CONFIG_KEYS = {
    "entrypoint": "Entrypoint",
    "cmd": "Cmd",
    "env": "Env",
    "user": "User",
    "workdir": "WorkingDir",
    "labels": "Labels",
    "exposed_ports": "ExposedPorts",
    "stop_signal": "StopSignal",
}
_BUF = 1 << 20


def normalize_name(name: str) -> str:
    """The fully qualified reference the kubelet (CRI) looks an image up by:
    ``redis:7.2`` -> ``docker.io/library/redis:7.2``, ``rljob/operator`` ->
    ``docker.io/rljob/operator:latest``, ``rljob.local/pause:test`` unchanged."""
    if not name or name != name.strip() or any(c.isspace() for c in name):
        raise ValueError(f"bad image name {name!r}")
    first, _, rest = name.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        name = f"docker.io/{name}" if rest else f"docker.io/library/{name}"
    first, _, rest = name.partition("/")
    if first == "docker.io" and "/" not in rest:
        name = f"docker.io/library/{rest}"
    last = name.rsplit("/", 1)[1]
    if ":" not in last and "@" not in last:
        name += ":latest"
    return name


def _tag(name: str) -> str:
    last = name.rsplit("/", 1)[1]
    return last.split("@", 1)[0].rsplit(":", 1)[1] if ":" in last.split("@", 1)[0] else "latest"


class _Sink(io.RawIOBase):
    """A write-only file that hashes (sha256) and counts what goes through it,
    passing it on to ``f`` (or nowhere)."""

    def __init__(self, f=None):
        self.f = f
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        if self.f is not None:
            self.f.write(b)
        self.sha.update(b)
        n = len(b)
        self.size += n
        return n

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha.hexdigest()}"


def _walk(rootfs: Path, empty_dirs: Iterable[str]) -> Iterable[tuple[Path, str]]:
    """(path, archive name) of everything under rootfs, sorted, parents first."""
    empty = {d.strip("/") for d in empty_dirs}
    for dirpath, dirnames, filenames in os.walk(rootfs):
        top = Path(dirpath)
        rel = top.relative_to(rootfs).as_posix()
        if rel in empty:
            dirnames[:] = []
            continue
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = top / name
            yield path, (name if rel == "." else f"{rel}/{name}")


@dataclass(frozen=True)
class Layer:
    """One layer of an image: the tree `rootfs` whole (`base` None), or what it adds to,
    changes in and removes from `base` (`diff_entries`); or `blob`, a layer written
    before (uncompressed, `write_layer`) with its digest and size."""

    rootfs: Path | None = None
    base: Path | None = None
    blob: Path | None = None
    digest: str = ""
    size: int = 0


WHITEOUT = ".wh."  # an entry named .wh.NAME removes NAME of the layers below


def _same(path: Path, st: os.stat_result, base: Path) -> bool:
    """Whether `path` (stat `st`) is what `base` holds at its place: the same inode
    (a hard link of `cp -al`), a directory with the same owner and mode, or a
    symbolic link to the same target."""
    try:
        bs = base.lstat()
    except FileNotFoundError:
        return False
    if stat.S_IFMT(st.st_mode) != stat.S_IFMT(bs.st_mode):
        return False
    if stat.S_ISDIR(st.st_mode):
        return (st.st_mode, st.st_uid, st.st_gid) == (bs.st_mode, bs.st_uid, bs.st_gid)
    if (st.st_dev, st.st_ino) == (bs.st_dev, bs.st_ino):
        return True
    return stat.S_ISLNK(st.st_mode) and os.readlink(path) == os.readlink(base)


def diff_entries(rootfs: Path, base: Path, empty_dirs: Iterable[str] = EMPTY_DIRS
                 ) -> list[tuple[Path | None, str]]:
    """(path, archive name) of what `rootfs` adds to or changes in `base`, with the
    directories above each (their metadata as in `rootfs`), and (None, name) for what
    it removes (a whole removed directory once), sorted, parents first."""
    empty_dirs = tuple(empty_dirs)
    out: dict[str, Path | None] = {}
    for path, arcname in _walk(rootfs, empty_dirs):
        if not _same(path, path.lstat(), base / arcname):
            out[arcname] = path
            parts = arcname.split("/")
            for i in range(1, len(parts)):
                parent = "/".join(parts[:i])
                out.setdefault(parent, rootfs / parent)
    gone: set[str] = set()
    for path, arcname in _walk(base, empty_dirs):
        parts = arcname.split("/")
        if any("/".join(parts[:i]) in gone for i in range(1, len(parts))):
            continue  # under a removed directory
        if not os.path.lexists(rootfs / arcname):
            gone.add(arcname)
            head, _, name = arcname.rpartition("/")
            out[f"{head}/{WHITEOUT}{name}" if head else f"{WHITEOUT}{name}"] = None
    return [(path, arcname) for arcname, path in
            sorted(out.items(), key=lambda kv: kv[0].split("/"))]


def _entries(layer: Layer, empty_dirs: Iterable[str]) -> Iterable[tuple[Path | None, str]]:
    if layer.base is None:
        return _walk(layer.rootfs, empty_dirs)
    return diff_entries(layer.rootfs, layer.base, empty_dirs)


def _write_layer(layer: Layer, out, empty_dirs: Iterable[str]) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path, arcname in _entries(layer, empty_dirs):
            if path is None:  # a whiteout
                info = tarfile.TarInfo(arcname)
                info.mode, info.mtime = 0o644, 0
                tar.addfile(info)
                continue
            info = tar.gettarinfo(str(path), arcname)
            if info is None:  # a socket
                continue
            info.uname = info.gname = ""
            info.mtime = int(info.mtime)
            if info.isreg():
                with open(path, "rb") as src:
                    tar.addfile(info, src)
            else:
                tar.addfile(info)


def _layer_pass(layer: Layer, f, compress: bool, empty_dirs) -> tuple[_Sink, _Sink]:
    """Writes the layer blob to f (None: nowhere); returns (blob sink, tar sink)."""
    blob = _Sink(f)
    if layer.blob is not None:  # written before, uncompressed: copied
        with open(layer.blob, "rb") as src:
            while chunk := src.read(_BUF):
                blob.write(chunk)
        return blob, blob
    if not compress:
        _write_layer(layer, blob, empty_dirs)
        return blob, blob
    with gzip.GzipFile(fileobj=blob, mode="wb", compresslevel=6, mtime=0) as gz:
        raw = _Sink(gz)
        _write_layer(layer, raw, empty_dirs)
    return blob, raw


def write_layer(rootfs, out, empty_dirs: Iterable[str] = EMPTY_DIRS) -> Layer:
    """Writes the tree `rootfs` as an uncompressed layer blob to the file `out` (it
    appears only complete); returns it as a `Layer` to pack."""
    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            sink, _ = _layer_pass(Layer(Path(rootfs)), f, False, tuple(empty_dirs))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return Layer(blob=out, digest=sink.digest, size=sink.size)


def image_config(config: dict, diff_id: str | Sequence[str]) -> dict:
    unknown = set(config) - set(_CONFIG_KEYS) - {"architecture", "os", "history"}
    if unknown:
        raise ValueError(f"unknown image config keys: {sorted(unknown)}")
    inner: dict = {}
    for key, field in _CONFIG_KEYS.items():
        if key not in config or config[key] is None or config[key] in ([], {}, ""):
            continue
        value = config[key]
        if key == "env" and isinstance(value, dict):
            value = [f"{k}={v}" for k, v in value.items()]
        if key == "exposed_ports":
            value = {(p if "/" in str(p) else f"{p}/tcp"): {} for p in value}
        inner[field] = value
    if not any(e.startswith("PATH=") for e in inner.get("Env", [])):
        inner["Env"] = [f"PATH={DEFAULT_PATH}", *inner.get("Env", [])]
    return {
        "architecture": config.get("architecture", "amd64"),
        "os": config.get("os", "linux"),
        "config": inner,
        "rootfs": {"type": "layers",
                   "diff_ids": [diff_id] if isinstance(diff_id, str) else list(diff_id)},
        "history": [{"created_by": config.get("history", "images/oci.py pack_rootfs")}
                    for _ in ([diff_id] if isinstance(diff_id, str) else diff_id)],
    }


def _member(tar_out, arcname: str, size: int, mode: int = 0o644,
            type_=tarfile.REGTYPE) -> None:
    info = tarfile.TarInfo(arcname)
    info.size, info.mode, info.type, info.mtime = size, mode, type_, 0
    tar_out.write(info.tobuf(tarfile.PAX_FORMAT))


def _pad(f, size: int) -> None:
    if size % tarfile.BLOCKSIZE:
        f.write(b"\0" * (tarfile.BLOCKSIZE - size % tarfile.BLOCKSIZE))


def pack_rootfs(rootfs, name: str | Sequence[str], out_archive, config: dict | None = None,
                *, compress: bool = False, empty_dirs: Iterable[str] = EMPTY_DIRS) -> dict:
    """Packs the directory ``rootfs`` as a one-layer OCI image archive ``out_archive``
    (`pack_layers` with one layer, the tree whole)."""
    rootfs = Path(rootfs)
    if not rootfs.is_dir():
        raise NotADirectoryError(rootfs)
    return pack_layers([Layer(rootfs)], name, out_archive, config, compress=compress,
                       empty_dirs=empty_dirs)


def pack_layers(layers: Sequence[Layer], name: str | Sequence[str], out_archive,
                config: dict | None = None, *, compress: bool = False,
                empty_dirs: Iterable[str] = EMPTY_DIRS) -> dict:
    """Packs ``layers`` (lowest first) as an OCI image archive ``out_archive``.

    ``name``: the image reference, or several (one ``index.json`` entry each, the same
    manifest), normalized (``rljob/operator:0.1.0`` -> ``docker.io/rljob/operator:0.1.0``).
    ``config``: ``entrypoint``, ``cmd`` (lists), ``env`` (``K=V`` list or dict),
    ``user``, ``workdir``, ``labels``, ``exposed_ports``, ``stop_signal``,
    ``architecture``/``os`` (default amd64/linux). ``compress``: gzip the layers that
    are trees (smaller, slower to write and to import). The contents of ``empty_dirs``
    are left out. The archive appears only complete (written next to it, then renamed).
    Returns what it wrote: names, digests, sizes (``layer``: the top layer's).
    """
    out = Path(out_archive)
    names = [name] if isinstance(name, str) else list(name)
    if not names or not layers:
        raise ValueError("no image name" if not names else "no layer")
    refs = [normalize_name(n) for n in names]
    config = dict(config or {})
    empty_dirs = tuple(empty_dirs)

    # pass 1: digests and sizes only (a blob's are known)
    descs, diff_ids = [], []
    for layer in layers:
        if layer.blob is not None:
            descs.append({"mediaType": LAYER_MEDIA_TYPE, "digest": layer.digest,
                          "size": layer.size})
            diff_ids.append(layer.digest)
            continue
        blob, raw = _layer_pass(layer, None, compress, empty_dirs)
        descs.append({"mediaType": LAYER_GZIP_MEDIA_TYPE if compress else LAYER_MEDIA_TYPE,
                      "digest": blob.digest, "size": blob.size})
        diff_ids.append(raw.digest)
    manifest_digest, small = _layout(refs, config, descs, diff_ids)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            for d in ("blobs/", "blobs/sha256/"):
                _member(f, d, 0, 0o755, tarfile.DIRTYPE)
            for arcname, data in small:
                _member(f, arcname, len(data))
                f.write(data)
                _pad(f, len(data))
            # pass 2: each layer, streamed after a header with its known size (once)
            written = set()
            for layer, desc in zip(layers, descs):
                if desc["digest"] in written:
                    continue
                written.add(desc["digest"])
                _member(f, f"blobs/sha256/{desc['digest'].split(':', 1)[1]}", desc["size"])
                again, _ = _layer_pass(layer, f, compress, empty_dirs)
                if (again.digest, again.size) != (desc["digest"], desc["size"]):
                    raise RuntimeError(f"{layer.rootfs or layer.blob} changed while it was "
                                       "being packed")
                _pad(f, desc["size"])
            f.write(b"\0" * (2 * tarfile.BLOCKSIZE))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"names": refs, "manifest": manifest_digest, "layer": descs[-1]["digest"],
            "layer_size": descs[-1]["size"], "diff_id": diff_ids[-1],
            "layers": [d["digest"] for d in descs], "archive": str(out),
            "archive_size": out.stat().st_size}


def _layout(refs: list[str], config: dict, descs: list[dict], diff_ids: list[str]
            ) -> tuple[str, list[tuple[str, bytes]]]:
    """The manifest's digest, and the small files of the layout: oci-layout,
    index.json, the config and the manifest."""
    def js(obj) -> bytes:
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()

    cfg = js(image_config(config, diff_ids[0] if len(diff_ids) == 1 else diff_ids))
    manifest = js({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE,
                   "digest": f"sha256:{hashlib.sha256(cfg).hexdigest()}", "size": len(cfg)},
        "layers": descs,
    })
    manifest_digest = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
    platform = {"architecture": config.get("architecture", "amd64"),
                "os": config.get("os", "linux")}
    index = js({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [{"mediaType": MANIFEST_MEDIA_TYPE, "digest": manifest_digest,
                       "size": len(manifest), "platform": platform,
                       "annotations": {NAME_ANNOTATION: ref, REF_ANNOTATION: _tag(ref)}}
                      for ref in refs],
    })
    return manifest_digest, [
        ("oci-layout", js({"imageLayoutVersion": "1.0.0"})), ("index.json", index),
        (f"blobs/sha256/{hashlib.sha256(cfg).hexdigest()}", cfg),
        (f"blobs/sha256/{manifest_digest.split(':', 1)[1]}", manifest)]


def _hash_member(tar: tarfile.TarFile, member: tarfile.TarInfo, gunzip: bool) -> tuple:
    """(sha256 digest, size) of a member, and of its gunzipped content if asked."""
    f = tar.extractfile(member)
    blob = _Sink()
    raw = _Sink()
    if gunzip:
        class Tee(io.RawIOBase):
            def readable(self):
                return True

            def readinto(self, b):
                data = f.read(len(b))
                blob.write(data)
                b[:len(data)] = data
                return len(data)
        with gzip.GzipFile(fileobj=io.BufferedReader(Tee(), _BUF)) as gz:
            while chunk := gz.read(_BUF):
                raw.write(chunk)
        while chunk := f.read(_BUF):  # trailing bytes, if any
            blob.write(chunk)
        return blob.digest, blob.size, raw.digest
    while chunk := f.read(_BUF):
        blob.write(chunk)
    return blob.digest, blob.size, blob.digest


def verify_archive(path) -> dict:
    """Checks that an archive is a well-formed OCI image layout: ``oci-layout``,
    ``index.json`` naming each image, and every blob the index, manifests and configs
    refer to present with the digest and size they are referred to by; each layer's
    uncompressed digest is its config's diff_id. Raises ValueError; returns
    {"names": [...], "images": [{"name", "manifest", "config", "layers"}]}."""
    def fail(msg: str):
        raise ValueError(f"{path}: {msg}")

    with tarfile.open(path, "r:") as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}

        def read(name: str) -> bytes:
            if name not in members or not members[name].isreg():
                fail(f"no {name}")
            return tar.extractfile(members[name]).read()

        def blob(desc: dict, media_types: tuple[str, ...]) -> tarfile.TarInfo:
            if desc.get("mediaType") not in media_types:
                fail(f"unexpected media type {desc.get('mediaType')!r}")
            algo, _, hexd = str(desc.get("digest", "")).partition(":")
            if algo != "sha256" or len(hexd) != 64:
                fail(f"bad digest {desc.get('digest')!r}")
            name = f"blobs/sha256/{hexd}"
            if name not in members:
                fail(f"missing blob {name}")
            if members[name].size != desc.get("size"):
                fail(f"{name}: size {members[name].size} != {desc.get('size')}")
            return members[name]

        def json_blob(desc: dict, media_type: str) -> dict:
            m = blob(desc, (media_type,))
            data = tar.extractfile(m).read()
            if f"sha256:{hashlib.sha256(data).hexdigest()}" != desc["digest"]:
                fail(f"{m.name}: content does not match its digest")
            return json.loads(data)

        if json.loads(read("oci-layout")).get("imageLayoutVersion") != "1.0.0":
            fail("oci-layout: imageLayoutVersion is not 1.0.0")
        index = json.loads(read("index.json"))
        if index.get("schemaVersion") != 2 or not index.get("manifests"):
            fail("index.json: no manifests")
        images, hashed = [], {}
        for desc in index["manifests"]:
            name = desc.get("annotations", {}).get(NAME_ANNOTATION)
            if not name:
                fail(f"index.json: a manifest without {NAME_ANNOTATION}")
            if normalize_name(name) != name:
                fail(f"index.json: {name} is not a normalized reference")
            manifest = json_blob(desc, MANIFEST_MEDIA_TYPE)
            if manifest.get("schemaVersion") != 2:
                fail("manifest: schemaVersion is not 2")
            config = json_blob(manifest["config"], CONFIG_MEDIA_TYPE)
            diff_ids = config.get("rootfs", {}).get("diff_ids", [])
            if len(diff_ids) != len(manifest["layers"]):
                fail("config: diff_ids and manifest layers differ in number")
            plat = desc.get("platform")
            if plat and (plat.get("architecture"), plat.get("os")) != (
                    config.get("architecture"), config.get("os")):
                fail("index.json: platform differs from the config's")
            for layer, diff_id in zip(manifest["layers"], diff_ids):
                m = blob(layer, (LAYER_MEDIA_TYPE, LAYER_GZIP_MEDIA_TYPE))
                if m.name not in hashed:
                    hashed[m.name] = _hash_member(
                        tar, m, layer["mediaType"] == LAYER_GZIP_MEDIA_TYPE)
                digest, _, uncompressed = hashed[m.name]
                if digest != layer["digest"]:
                    fail(f"{m.name}: content does not match its digest")
                if uncompressed != diff_id:
                    fail(f"{m.name}: uncompressed content does not match diff_id {diff_id}")
            images.append({"name": name, "manifest": desc["digest"],
                           "config": config, "layers": manifest["layers"]})
    return {"names": [i["name"] for i in images], "images": images}


def archive_images(path) -> list[tuple[str, str]]:
    """(name, manifest digest) of each image of an archive, from its index alone."""
    with tarfile.open(path, "r:") as tar:
        index = json.loads(tar.extractfile("index.json").read())
    return [(d["annotations"][NAME_ANNOTATION], d["digest"]) for d in index["manifests"]]


def layer_members(path, name: str | None = None) -> list[tarfile.TarInfo]:
    """The entries of the (first, or the named image's) layer of an archive."""
    with tarfile.open(path, "r:") as tar:
        index = json.loads(tar.extractfile("index.json").read())
        desc = next(d for d in index["manifests"]
                    if name is None or d["annotations"][NAME_ANNOTATION] == normalize_name(name))
        manifest = json.loads(tar.extractfile(f"blobs/sha256/{desc['digest'][7:]}").read())
        layer = manifest["layers"][0]
        f = tar.extractfile(f"blobs/sha256/{layer['digest'][7:]}")
        mode = "r|gz" if layer["mediaType"] == LAYER_GZIP_MEDIA_TYPE else "r|"
        with tarfile.open(fileobj=f, mode=mode) as inner:
            return list(inner)


def tree_size(root) -> int:
    """Bytes of the regular files under root, each inode once (what a layer carries)."""
    seen, total = set(), 0
    for dirpath, _, filenames in os.walk(root):
        for n in filenames:
            st = os.lstat(os.path.join(dirpath, n))
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def import_archive(archive, containerd_socket, namespace: str = "k8s.io",
                   ctr: str = "ctr") -> str:
    """Imports an image archive into containerd (namespace ``k8s.io`` is the one the
    CRI plugin, so the kubelet, sees) and unpacks it; returns ctr's output."""
    import subprocess

    proc = subprocess.run(
        [ctr, "--address", str(containerd_socket), "--namespace", namespace,
         "images", "import", str(archive)],
        capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"ctr images import {archive} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout
