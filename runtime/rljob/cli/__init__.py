"""`rljob` command line, one module per command group: the job's commands
(crd, validate, render, run), planning (profile, plan, simulate), a reward served
on reward.url's protocol, the workers' entrypoints and the benchmarks."""

from . import bench, job, plan, reward, worker  # noqa: F401 - each adds its commands to the app
from .app import app, main

__all__ = ["app", "main"]
