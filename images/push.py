"""Pushes the OCI archives of ``images.build`` to a registry, with crane
(github.com/google/go-containerregistry), and prints each image's name by digest.

    sudo python -m images.build runtime operator | python -m images.push REGISTRY
    python -m images.push REGISTRY docker.io/rljob/runtime:0.1.0-cpu=runtime.oci.tar ...

REGISTRY is the registry and the path the images go under, e.g.
``registry.example.com/ml/rljob``: ``docker.io/rljob/runtime:0.1.0-cpu`` goes to
``registry.example.com/ml/rljob/runtime:0.1.0-cpu``. crane reads the credentials that
``crane auth login`` or ``docker login`` stored (``~/.docker/config.json``); a registry
whose certificate a private CA signed takes ``--ca FILE`` (or ``SSL_CERT_FILE``).

Each archive is unpacked into an OCI image layout next to it and pushed as it is: the
layers keep their digests (the node's image store and the registry share blobs by
digest, so an unchanged layer is neither uploaded nor pulled again). Prints one line
per image on stdout, ``TARGET@sha256:...``, and the Helm values that name them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pushed:
    source: str  # the name images.build gave it (docker.io/rljob/runtime:0.1.0-cpu)
    target: str  # REGISTRY/runtime:0.1.0-cpu
    digest: str  # sha256:... of the manifest the registry holds

    @property
    def pinned(self) -> str:
        return f"{self.target.rsplit(':', 1)[0]}@{self.digest}"


def target_of(source: str, registry: str) -> str:
    """``docker.io/rljob/runtime:0.1.0-cpu`` under ``registry.example.com/ml`` ->
    ``registry.example.com/ml/runtime:0.1.0-cpu`` (the last path part and the tag)."""
    registry = registry.rstrip("/")
    if not registry or "://" in registry or any(c.isspace() for c in registry):
        raise ValueError(f"registry {registry!r}: give a host and path, e.g. "
                         "registry.example.com/ml/rljob (no scheme)")
    name = source.rsplit("/", 1)[-1]
    if ":" not in name:
        raise ValueError(f"image {source!r} has no tag")
    return f"{registry}/{name}"


def crane_binary(explicit: str | None = None) -> str:
    found = explicit or os.environ.get("RLJOB_CRANE") or shutil.which("crane")
    if not found:
        raise SystemExit("crane is not on PATH: install it (go install "
                         "github.com/google/go-containerregistry/cmd/crane@latest, or a "
                         "release binary) or name it with --crane / RLJOB_CRANE")
    return found


def unpack(archive: Path, into: Path) -> Path:
    """The archive's OCI image layout as a folder (what crane pushes as it is)."""
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    if not (into / "index.json").is_file():
        raise ValueError(f"{archive} is not an OCI image archive (no index.json)")
    return into


def push(archive: Path, source: str, registry: str, crane: str,
         env: dict[str, str] | None = None) -> Pushed:
    target = target_of(source, registry)
    with tempfile.TemporaryDirectory(prefix="rljob-push-", dir=archive.parent) as tmp:
        layout = unpack(archive, Path(tmp))
        done = subprocess.run([crane, "push", str(layout), target], capture_output=True,
                              text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"crane push {target} failed: {done.stderr.strip()[-2000:]}")
    pinned = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if "@sha256:" not in pinned:
        raise RuntimeError(f"crane push {target} printed no digest: {done.stdout!r}")
    return Pushed(source, target, pinned.rsplit("@", 1)[1])


def helm_values(pushed: Iterable[Pushed]) -> list[str]:
    """The chart's values that name the pushed images by digest (what was pushed, even
    if the tag moves later)."""
    out = []
    for p in pushed:
        repo = p.target.rsplit(":", 1)[0]
        if repo.endswith("/operator"):
            out += [f"image.repository={repo}", f"image.digest={p.digest}"]
        elif repo.endswith("/runtime"):
            out.append(f"runtimeImage={p.pinned}")
    return out


def parse_pairs(args: list[str], stdin: Iterable[str]) -> list[tuple[str, Path]]:
    """NAME=ARCHIVE arguments, or else images.build's output lines (NAME ARCHIVE)."""
    pairs = [tuple(a.split("=", 1)) for a in args] if args else [
        tuple(line.split()) for line in stdin if line.strip()]
    bad = [p for p in pairs if len(p) != 2]
    if bad or not pairs:
        raise SystemExit("give NAME=ARCHIVE arguments or pipe `python -m images.build`'s "
                         f"output (lines of NAME ARCHIVE); got {bad or 'nothing'}")
    return [(name, Path(path)) for name, path in pairs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m images.push", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("registry", help="registry and path, e.g. registry.example.com/ml/rljob")
    ap.add_argument("images", nargs="*", metavar="NAME=ARCHIVE",
                    help="default: images.build's output lines on stdin")
    ap.add_argument("--ca", type=Path, help="the CA that signed the registry's certificate")
    ap.add_argument("--crane", help="the crane binary (default: RLJOB_CRANE, then PATH)")
    args = ap.parse_args(argv)
    crane = crane_binary(args.crane)
    env = dict(os.environ)
    if args.ca:
        env["SSL_CERT_FILE"] = str(args.ca.resolve())
    pushed = []
    for source, archive in parse_pairs(args.images, [] if args.images else sys.stdin):
        try:
            pushed.append(push(archive, source, args.registry, crane, env))
        except (ValueError, RuntimeError, OSError) as e:
            print(f"images.push: {e}", file=sys.stderr)
            return 1
        print(pushed[-1].pinned, flush=True)
    print("helm install ... " + " ".join(f"--set {v}" for v in helm_values(pushed)),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
