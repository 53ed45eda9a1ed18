"""`python -m images.push` against the real registry of the cluster tier (no node):
what the cluster guide says of a push, that the layers keep their digests and a
second push of an unchanged image uploads nothing."""

from __future__ import annotations

import subprocess
import sys

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
    finally:
        registry.stop()
