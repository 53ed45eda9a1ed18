"""Dockerfiles lint clean with hadolint; versions agree across package, images, chart;
the daemonless image builder's pieces (images/oci.py archives, images/install.py's
install definition, images/build.py's image names) hold without building anything."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

from images import oci
from images.install import closure

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


# ---- images/oci.py: OCI archives (what images/build.py writes) -------------------

def tiny_rootfs(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin/hello").write_text("#!/bin/sh\necho hello\n")
    (root / "bin/hello").chmod(0o755)
    (root / "bin/hi").symlink_to("hello")
    os.link(root / "bin/hello", root / "bin/hello2")
    (root / "etc").mkdir()
    (root / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (root / "home/app").mkdir(parents=True)
    (root / "home/app/data").write_bytes(os.urandom(3000))
    for d in oci.EMPTY_DIRS:
        (root / d).mkdir()
    (root / "dev/null-ish").write_text("not packed")
    if os.geteuid() == 0:
        os.chown(root / "home/app", 1000, 1000)
        os.chown(root / "home/app/data", 1000, 1000)
    return root


CONFIG = {"entrypoint": ["/bin/hello"], "cmd": ["--x"], "env": {"A": "1"},
          "user": "1000:1000", "workdir": "/home/app", "exposed_ports": [8080]}


def _apply_layers(archive: Path, into: Path) -> None:
    """Unpacks an archive's layers in order, as a container runtime does: a
    `.wh.NAME` entry removes NAME of the layers below."""
    with tarfile.open(archive) as tar:
        index = json.loads(tar.extractfile("index.json").read())
        manifest = json.loads(tar.extractfile(
            f"blobs/sha256/{index['manifests'][0]['digest'][7:]}").read())
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=tar.extractfile(
                    f"blobs/sha256/{layer['digest'][7:]}"), mode="r|") as inner:
                for m in inner:
                    head, _, name = m.name.rpartition("/")
                    if name.startswith(oci.WHITEOUT):
                        gone = into / head / name[len(oci.WHITEOUT):]
                        shutil.rmtree(gone) if gone.is_dir() and not gone.is_symlink() \
                            else gone.unlink()
                        continue
                    inner.extract(m, into, filter="tar")


def _tree(root: Path) -> dict[str, bytes | str]:
    return {p.relative_to(root).as_posix(): (os.readlink(p) if p.is_symlink() else
                                             p.read_bytes() if p.is_file() else "dir")
            for p in sorted(root.rglob("*")) if p.relative_to(root).parts[0] not in
            oci.EMPTY_DIRS}


def test_an_image_of_two_layers_carries_only_what_the_top_tree_changed(tmp_path):
    """The runtime image is its dependencies' layer, written once and reused, and a
    layer of what the application adds (a tree made with `cp -al` of the lower one):
    the top layer holds the new and replaced files and the directories above them,
    and whiteouts for what was removed; unpacked in order, the layers give the top
    tree exactly."""
    base = tiny_rootfs(tmp_path / "base")
    (base / "usr/lib/old").mkdir(parents=True)
    (base / "usr/lib/old/a.py").write_text("old")
    top = tmp_path / "top"
    subprocess.run(["cp", "-al", str(base), str(top)], check=True)
    (top / "usr/lib/app").mkdir()
    (top / "usr/lib/app/new.py").write_text("new")
    (top / "etc/passwd").unlink()
    (top / "etc/passwd").write_text("root:x:0:0::/root:/bin/bash\n")  # replaced
    (top / "bin/hello2").unlink()
    shutil.rmtree(top / "usr/lib/old")
    lower = oci.write_layer(base, tmp_path / "deps.tar")
    again = oci.write_layer(base, tmp_path / "deps-again.tar")
    assert (again.digest, again.size) == (lower.digest, lower.size)  # reproducible
    archive = tmp_path / "img.tar"
    packed = oci.pack_layers([lower, oci.Layer(top, base)], "rljob/two:1", archive, CONFIG)
    checked = oci.verify_archive(archive)
    assert [d["digest"] for d in checked["images"][0]["layers"]] == packed["layers"]
    assert packed["layers"][0] == lower.digest
    assert len(checked["images"][0]["config"]["rootfs"]["diff_ids"]) == 2
    with tarfile.open(archive) as tar:
        blob = tar.extractfile(f"blobs/sha256/{packed['layer'][7:]}")
        names = [m.name for m in tarfile.open(fileobj=blob, mode="r|")]
    # bin/ itself unchanged (a file of it removed): only its whiteout
    assert names == ["bin/.wh.hello2", "etc", "etc/passwd", "usr", "usr/lib",
                     "usr/lib/.wh.old", "usr/lib/app", "usr/lib/app/new.py"], names
    out = tmp_path / "unpacked"
    out.mkdir()
    _apply_layers(archive, out)
    assert _tree(out) == _tree(top)


@pytest.mark.parametrize("compress", [False, True], ids=["tar", "gzip"])
def test_oci_archive_is_well_formed(tmp_path, compress):
    root = tiny_rootfs(tmp_path / "rootfs")
    archive = tmp_path / "out" / "img.tar"
    packed = oci.pack_rootfs(root, ["rljob/test:1", "rljob.local/test:1-alias"], archive,
                             CONFIG, compress=compress)
    assert not archive.with_name("img.tar.partial").exists()
    checked = oci.verify_archive(archive)
    assert checked["names"] == packed["names"] == [
        "docker.io/rljob/test:1", "rljob.local/test:1-alias"]

    with tarfile.open(archive) as tar:
        index = json.loads(tar.extractfile("index.json").read())
        assert json.loads(tar.extractfile("oci-layout").read()) == {"imageLayoutVersion": "1.0.0"}
        blobs = {m.name for m in tar.getmembers() if m.name.startswith("blobs/sha256/")}
    assert len(blobs) == 3  # config, manifest, layer: one set for both names
    desc = index["manifests"][0]
    assert index["mediaType"] == oci.INDEX_MEDIA_TYPE
    assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
    assert desc["annotations"] == {oci.NAME_ANNOTATION: "docker.io/rljob/test:1",
                                   oci.REF_ANNOTATION: "1"}
    assert {d["digest"] for d in index["manifests"]} == {packed["manifest"]}

    image = checked["images"][0]
    cfg = image["config"]["config"]
    assert cfg["Entrypoint"] == ["/bin/hello"] and cfg["Cmd"] == ["--x"]
    assert cfg["Env"][0].startswith("PATH=") and "A=1" in cfg["Env"]
    assert (cfg["User"], cfg["WorkingDir"]) == ("1000:1000", "/home/app")
    assert cfg["ExposedPorts"] == {"8080/tcp": {}}
    assert image["layers"][0]["mediaType"] == (
        oci.LAYER_GZIP_MEDIA_TYPE if compress else oci.LAYER_MEDIA_TYPE)

    members = {m.name: m for m in oci.layer_members(archive)}
    assert "dev" in members and "dev/null-ish" not in members  # the runtime mounts /dev
    assert {"proc", "sys"} <= set(members)
    assert members["bin/hello"].mode & 0o777 == 0o755
    assert members["bin/hi"].issym() and members["bin/hi"].linkname == "hello"
    assert members["bin/hello2"].islnk() and members["bin/hello2"].linkname == "bin/hello"
    order = list(members)
    assert all(order.index(n.rsplit("/", 1)[0]) < i  # parents first
               for i, n in enumerate(order) if "/" in n)
    if os.geteuid() == 0:
        assert (members["home/app/data"].uid, members["home/app/data"].gid) == (1000, 1000)

    # the same tree packs to the same digests
    again = oci.pack_rootfs(root, "rljob/test:1", tmp_path / "again.tar", CONFIG,
                            compress=compress)
    assert (again["manifest"], again["layer"]) == (packed["manifest"], packed["layer"])


def rewrite(archive: Path, out: Path, change) -> None:
    """Copies an archive, passing each (name, bytes) through change."""
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isreg() else None
            if data is not None:
                data = change(m.name, data)
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)


def test_verify_archive_catches_damage(tmp_path):
    archive = tmp_path / "img.tar"
    packed = oci.pack_rootfs(tiny_rootfs(tmp_path / "rootfs"), "rljob/test:1", archive, CONFIG)
    layer = f"blobs/sha256/{packed['layer'][7:]}"

    def flip(name, data):  # same size, other content
        return data[:600] + bytes([data[600] ^ 1]) + data[601:] if name == layer else data
    rewrite(archive, tmp_path / "flipped.tar", flip)
    with pytest.raises(ValueError, match="does not match its digest"):
        oci.verify_archive(tmp_path / "flipped.tar")

    def unnamed(name, data):
        if name != "index.json":
            return data
        index = json.loads(data)
        del index["manifests"][0]["annotations"][oci.NAME_ANNOTATION]
        return json.dumps(index).encode()
    rewrite(archive, tmp_path / "unnamed.tar", unnamed)
    with pytest.raises(ValueError, match="without io.containerd.image.name"):
        oci.verify_archive(tmp_path / "unnamed.tar")

    def resized(name, data):  # a manifest whose layer size lies
        if not name.startswith("blobs/") or len(data) > 4096:  # not the layer
            return data
        manifest = json.loads(data)
        if "layers" not in manifest:  # the config
            return data
        manifest["layers"][0]["size"] += 1
        return json.dumps(manifest).encode()
    rewrite(archive, tmp_path / "resized.tar", resized)
    with pytest.raises(ValueError):
        oci.verify_archive(tmp_path / "resized.tar")


@pytest.mark.parametrize("name,ref", [
    ("redis:7.2", "docker.io/library/redis:7.2"),
    ("rljob/operator:0.1.0", "docker.io/rljob/operator:0.1.0"),
    ("rljob/runtime", "docker.io/rljob/runtime:latest"),
    ("docker.io/redis:7", "docker.io/library/redis:7"),
    ("rljob.local/pause:test", "rljob.local/pause:test"),
    ("localhost:5000/x/y:z", "localhost:5000/x/y:z"),
    ("localhost/x", "localhost/x:latest"),
])
def test_image_names_are_normalized_like_the_kubelet_asks(name, ref):
    assert oci.normalize_name(name) == ref


# ---- images/install.py and images/build.py: one definition, the names pods use ----

def test_dockerfiles_install_through_the_shared_definition():
    from images.install import FLAVORS
    for path in DOCKERFILES:
        text = path.read_text()
        flavors = re.findall(r"install\.py (\w+) ", text)
        assert flavors and set(flavors) <= set(FLAVORS), path
        assert "COPY images/install.py" in text, path


def test_install_closure_drops_what_only_excluded_packages_need():
    def pkg(name, *requires):
        return {"metadata": {"name": name, "version": "1", "requires_dist": list(requires)}}
    report = {"install": [
        pkg("rljob", "torch>=2", "numpy", "kopf; extra == 'operator'"),
        pkg("torch", "sympy", "numpy", "Nvidia-CUBLAS; platform_system == 'Linux'",
            "triton; platform_system == 'Linux'", "optree; extra == 'optree'"),
        pkg("triton", "filelock"), pkg("filelock"), pkg("sympy", "mpmath"), pkg("mpmath"),
        pkg("numpy"), pkg("nvidia_cublas"), pkg("kopf", "aiohttp"), pkg("aiohttp"),
        pkg("optree"),
    ]}
    linux = sys.platform.startswith("linux")
    names = [n for n, _ in closure(report, {"rljob": set()}, ["triton"])]
    assert names == sorted(["rljob", "torch", "numpy", "sympy", "mpmath"]
                           + (["nvidia_cublas"] if linux else []))
    names = [n for n, _ in closure(report, {"rljob": {"operator"}}, ["torch"])]
    assert names == ["aiohttp", "kopf", "numpy", "rljob"]


def test_built_image_names_match_what_pods_and_chart_use():
    from images.build import images
    from rljob.api.spec import RLJobSpec
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    specs = images(version)
    chart = yaml.safe_load((REPO / "charts/rljob-operator/Chart.yaml").read_text())
    values = yaml.safe_load((REPO / "charts/rljob-operator/values.yaml").read_text())
    assert specs["operator"].tags == (f"{values['image']['repository']}:{chart['appVersion']}",)
    assert values["podSecurityContext"]["runAsUser"] == specs["operator"].uid
    # the CPU variant of the runtime image the RLJob spec defaults to
    assert specs["runtime"].tags == (RLJobSpec.model_fields["image"].default + "-cpu",)
    for image in specs.values():
        oci.image_config(image.oci_config(), "sha256:" + "0" * 64)  # a valid config


# ---- images/push.py: the archives to a registry (pushed for real in the node tier) --

def test_push_names_each_image_under_the_registry_and_prints_the_charts_values():
    from images import push
    assert push.target_of("docker.io/rljob/runtime:0.1.0-cpu", "registry.example.com/ml/rljob/"
                          ) == "registry.example.com/ml/rljob/runtime:0.1.0-cpu"
    for bad in ("https://registry.example.com", "", "reg istry"):
        with pytest.raises(ValueError, match="registry"):
            push.target_of("docker.io/rljob/runtime:0.1.0-cpu", bad)
    digest = "sha256:" + "ab" * 32
    pushed = [push.Pushed("docker.io/rljob/operator:0.1.0", "r.example/x/operator:0.1.0", digest),
              push.Pushed("docker.io/rljob/runtime:0.1.0-cpu", "r.example/x/runtime:0.1.0-cpu",
                          digest)]
    assert pushed[1].pinned == f"r.example/x/runtime@{digest}"
    assert push.helm_values(pushed) == ["image.repository=r.example/x/operator",
                                        f"image.digest={digest}",
                                        f"runtimeImage=r.example/x/runtime@{digest}"]
    # images.build's output lines on stdin, or NAME=ARCHIVE arguments
    assert push.parse_pairs([], ["a:1 /x/a.tar\n", "\n"]) == [("a:1", Path("/x/a.tar"))]
    assert push.parse_pairs(["a:1=/x/a.tar"], []) == [("a:1", Path("/x/a.tar"))]
    with pytest.raises(SystemExit, match="NAME=ARCHIVE"):
        push.parse_pairs([], ["just-one-word\n"])


def test_an_archive_unpacks_to_the_layout_crane_pushes(tmp_path):
    from images import push
    rootfs = tmp_path / "root"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "hello").write_text("hi")
    archive = tmp_path / "img.tar"
    oci.pack_rootfs(rootfs, "rljob/x:1", archive, {"entrypoint": ["/bin/true"]})
    layout = push.unpack(archive, tmp_path / "layout")
    index = json.loads((layout / "index.json").read_text())
    manifest = index["manifests"][0]["digest"].split(":")[1]
    assert (layout / "blobs" / "sha256" / manifest).is_file()
    with tarfile.open(tmp_path / "empty.tar", "w"):
        pass
    with pytest.raises(ValueError, match="not an OCI image archive"):
        push.unpack(tmp_path / "empty.tar", tmp_path / "empty")


def test_the_node_tier_takes_off_the_operator_image_and_the_id_that_holds_it():
    """Before the journey, the node loses every name that would keep the operator's
    layers (so helm install pulls them from the registry): the operator's names, an
    earlier run's registry names, and the kubelet's `sha256:` id of a pull, unless a
    name that stays shares its target."""
    from tests.cluster.test_e2e import _stale_images

    targets = {"docker.io/rljob/operator:0.1.0": "sha256:op",
               "127.0.0.1:4100/rljob/operator@sha256:op": "sha256:op",
               "sha256:op-config": "sha256:op",
               "docker.io/rljob/runtime:0.1.0-cpu": "sha256:rt",
               "127.0.0.1:4100/rljob/runtime@sha256:rt": "sha256:rt",
               "sha256:rt-config": "sha256:rt",
               "registry.k8s.io/pause:3.10": "sha256:pause", "sha256:pause-id": "sha256:pause"}
    assert _stale_images(targets) == ["127.0.0.1:4100/rljob/operator@sha256:op",
                                      "127.0.0.1:4100/rljob/runtime@sha256:rt",
                                      "docker.io/rljob/operator:0.1.0", "sha256:op-config"]
