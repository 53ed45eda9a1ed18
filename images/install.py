#!/usr/bin/env python3
"""What an rljob image installs: one definition for the Dockerfiles (images/*/Dockerfile)
and the daemonless builder (images/build.py).

Run it with the Python that will run rljob (a venv's, or the image's python3), with
the rljob wheel in a --find-links directory:

    python3 install.py npu --find-links /wheels --version 0.1.0        # accelerator image
    python3 install.py cpu --find-links /wheels --version 0.1.0        # CPU runtime image
    python3 install.py operator --find-links /wheels --version 0.1.0   # operator image

``--constraint LOCK`` installs the versions a lock pins (the CPU and operator images:
the repository's locks/test.txt, the set the tests pass with; the accelerator image's
stack is its base image's, which PyPI alone cannot resolve).

A flavor installs ``rljob[extras]`` and everything it requires, less the packages the
flavor excludes (and what is required only through them), then removes files that
are never loaded. ``--only deps`` installs everything but rljob itself, ``--only app``
rljob alone (no dependencies, from --find-links only), so an image can cache its
dependencies apart from the code. ``--wheelhouse DIR`` downloads into DIR (files
already there are not downloaded again) and installs from it. ``--plan`` prints what
would be installed. pip's own options come from the environment (PIP_NO_CACHE_DIR,
PIP_INDEX_URL, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Flavor:
    extras: tuple[str, ...] = ()
    # distribution names left out, with whatever is required only through them
    exclude: tuple[str, ...] = ()
    # globs under site-packages removed after installing
    prune: tuple[str, ...] = ()


# PyPI's torch for Linux x86_64 is a CUDA build. `import torch` needs the CUDA
# libraries that libtorch_cuda.so and libtorch_cpu.so link against (cuBLAS(Lt),
# cudart, cuFFT, cuFile, CUPTI, cuSPARSE(Lt), NCCL, NVRTC, nvJitLink, NVSHMEM, cuDNN's
# loader), so torch --no-deps does not import; these are installed, and what is
# only loaded on a GPU is not: triton, cuSOLVER, CCCL, NVTX, cuda-bindings, cuDNN's
# engine libraries (dlopen'ed by libcudnn.so on first use), static libraries, headers.
CUDA_UNUSED_ON_CPU = ("triton", "nvidia-cusolver", "nvidia-cuda-cccl", "nvidia-nvtx",
                      "cuda-bindings")
CUDA_PRUNE_ON_CPU = (
    "nvidia/cudnn/lib/libcudnn_*.so*",
    "nvidia/*/lib/*.a",
    "nvidia/*/lib/libnvperf_*.so*",
    "nvidia/*/lib/libpcsamplingutil.so*",
    "nvidia/*/lib/libcheckpoint.so*",
    "nvidia/*/include",
    "torch/include",
)

FLAVORS = {
    # the accelerator base image brings CANN, torch_npu and vLLM-Ascend
    # (and both runtime flavors carry W&B for logging.wandb, the MCP SDK for
    # rollout.mcpServers and PEFT for model.lora)
    "npu": Flavor(extras=("npu", "wandb", "mcp", "lora")),
    # `rljob worker ...` on CPU: TransferQueue, driver, rollout (HF engine), trainer
    "cpu": Flavor(extras=("wandb", "mcp", "lora"), exclude=CUDA_UNUSED_ON_CPU,
                  prune=CUDA_PRUNE_ON_CPU),
    # the operator imports rljob's API models, planner and TransferQueue client only
    "operator": Flavor(extras=("operator",),
                       exclude=("torch", "transformers", "matplotlib", "pyarrow")),
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(report: dict, roots: dict[str, set[str]], exclude) -> list[tuple[str, str]]:
    """(name, version) of the packages of a pip install report reachable from roots
    (name -> extras) through their requirements, never through an excluded name.
    Packages already installed are not in a report, so not in the result."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    items = {canonical(i["metadata"]["name"]): i["metadata"] for i in report["install"]}
    excluded = {canonical(n) for n in exclude}
    extras_of: dict[str, set[str]] = {}
    queue = [(canonical(n), set(e)) for n, e in roots.items()]
    while queue:
        name, extras = queue.pop()
        if name in excluded or name not in items:
            continue
        if name in extras_of and extras <= extras_of[name]:
            continue
        extras_of[name] = extras_of.get(name, set()) | extras
        for spec in items[name].get("requires_dist") or ():
            req = Requirement(spec)
            if req.marker is not None and not any(
                    req.marker.evaluate({"extra": e}) for e in (extras_of[name] or {""})):
                continue
            queue.append((canonical(req.name), set(req.extras)))
    return sorted((items[n]["name"], items[n]["version"]) for n in extras_of)


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def prune(patterns) -> int:
    """Removes the globs under each site-packages directory; returns bytes freed."""
    freed = 0
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    for site in map(Path, dirs):
        for pattern in patterns:
            for path in site.glob(pattern):
                if path.is_dir() and not path.is_symlink():
                    freed += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
                    shutil.rmtree(path)
                else:
                    freed += path.lstat().st_size
                    path.unlink()
    return freed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("flavor", choices=sorted(FLAVORS))
    ap.add_argument("--find-links", action="append", default=[], metavar="DIR",
                    help="where the rljob wheel is (repeatable)")
    ap.add_argument("--version", required=True, help="the rljob version to install")
    ap.add_argument("--only", choices=("all", "deps", "app"), default="all")
    ap.add_argument("--wheelhouse", metavar="DIR",
                    help="download into DIR (keeping what is there) and install from it")
    ap.add_argument("--plan", action="store_true", help="print the packages and stop")
    ap.add_argument("--constraint", metavar="LOCK",
                    help="install the versions this lock pins (pip's constraints file)")
    args = ap.parse_args(argv)
    flavor = FLAVORS[args.flavor]
    links = [a for d in args.find_links for a in ("--find-links", d)]
    extras = f"[{','.join(flavor.extras)}]" if flavor.extras else ""
    root = f"rljob{extras}=={args.version}"
    quiet = ["--disable-pip-version-check", "--no-input", "--progress-bar", "off"]
    if args.constraint:
        quiet += ["--constraint", args.constraint]

    if args.only == "app":
        pip("install", *quiet, "--no-deps", "--no-index", *links, f"rljob=={args.version}")
        return 0
    if not flavor.exclude and args.only == "all" and not args.plan:
        pip("install", *quiet, *links, root)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            pip("install", *quiet, "--dry-run", "--quiet", "--report", str(report),
                *links, root)
            plan = closure(json.loads(report.read_text()), {"rljob": set(flavor.extras)},
                           flavor.exclude)
        if args.only == "deps":
            plan = [(n, v) for n, v in plan if canonical(n) != "rljob"]
        if args.plan:
            print("\n".join(f"{n}=={v}" for n, v in plan))
            return 0
        specs = [f"{n}=={v}" for n, v in plan]
        if plan and args.wheelhouse:
            pip("download", *quiet, "--no-deps", "--dest", args.wheelhouse, *links, *specs)
            pip("install", *quiet, "--no-deps", "--no-index", "--find-links", args.wheelhouse,
                *links, *specs)
        elif plan:
            pip("install", *quiet, "--no-deps", *links, *specs)
    if flavor.prune:
        freed = prune(flavor.prune)
        print(f"pruned {freed / 2**20:.0f} MiB never loaded by this flavor", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PIP_ROOT_USER_ACTION", "ignore")
    sys.exit(main())
