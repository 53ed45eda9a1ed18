"""`python -m images.push` against the real registry of the cluster tier (no node):
what the cluster guide says of a push, that the layers keep their digests, a second
push of an unchanged image uploads nothing, and an image whose code changed uploads
its own layer only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile

from images import oci
from tests.cluster.controlplane import REPO
from tests.cluster.registry import Registry


def test_a_second_push_of_an_unchanged_image_uploads_nothing(bin_dir, tmp_path):
    out = subprocess.run([sys.executable, "-m", "images.build", "operator"], cwd=REPO,
                         capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    registry = Registry(bin_dir, tmp_path / "registry").start()
    try:
        first = registry.push(out.stdout)
        log = tmp_path / "registry" / "registry.log"
        uploads = log.read_text().count("/blobs/uploads/")
        assert uploads > 0  # the first push uploaded the layer and the config
        again = registry.push(out.stdout)
        assert again == first  # the same digest
        assert log.read_text().count("/blobs/uploads/") == uploads, registry.log_tail()
        # the same dependencies' layer under other code: its layer and config go up
        changed = _with_other_code(out.stdout.split()[1], tmp_path)
        posts = log.read_text().count('"POST /v2/rljob/operator/blobs/uploads/')
        registry.push(f"docker.io/rljob/operator:changed {changed}\n")
        assert log.read_text().count('"POST /v2/rljob/operator/blobs/uploads/') == \
            posts + 2, registry.log_tail()
    finally:
        registry.stop()


def _with_other_code(archive: str, tmp_path):
    """An image of `archive`'s first layer (the dependencies') and another top layer."""
    with tarfile.open(archive) as tar:
        index = json.loads(tar.extractfile("index.json").read())
        manifest = json.loads(tar.extractfile(
            f"blobs/sha256/{index['manifests'][0]['digest'][7:]}").read())
        deps = manifest["layers"][0]
        blob = tmp_path / "deps.tar"
        with tar.extractfile(f"blobs/sha256/{deps['digest'][7:]}") as src, \
                open(blob, "wb") as dst:
            shutil.copyfileobj(src, dst)
    code = tmp_path / "code"
    (code / "opt/app").mkdir(parents=True)
    (code / "opt/app/changed.py").write_text("print('changed')\n")
    out = tmp_path / "changed.tar"
    oci.pack_layers([oci.Layer(blob=blob, digest=deps["digest"], size=deps["size"]),
                     oci.Layer(code)], "rljob/operator:changed", out)
    return out
