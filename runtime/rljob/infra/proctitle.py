"""A worker's role and replica in `ps` and `top`: its process title.

Every process of a job runs `python -m rljob ...` (or is a fork of the fork server,
whose command line it keeps), so without a title `ps` shows a dozen identical lines.
As PostgreSQL's backends and Celery's workers do, each one rewrites its title
(setproctitle: `ps`, `/proc/PID/cmdline`) and its short name (`top`, `ps -o comm`,
`/proc/PID/comm`, 15 bytes) once it knows what it is:

    rljob: trainer rank 0/2 [quickstart]        comm: rljob-trainer0
    rljob: rollout replica 1 [quickstart]       comm: rljob-rollout1
    rljob: transferqueue [quickstart]           comm: rljob-tq
    rljob: driver [quickstart]                  comm: rljob-driver
    rljob: fork server [runs/quickstart]        comm: rljob-forksrv
"""

from __future__ import annotations

from dataclasses import dataclass

COMM_BYTES = 15  # the kernel's TASK_COMM_LEN, less its terminating NUL
_SHORT = {"transferqueue": "tq", "fork server": "forksrv"}


@dataclass(frozen=True)
class Title:
    title: str  # what `ps` shows
    comm: str   # what `top` shows


def worker_title(role: str, index: int | None = None, of: int | None = None,
                 job: str | None = None) -> Title:
    """The title of a worker of `role` (trainer: its rank of `of`; rollout: its replica)
    in the job or run named `job` (pure)."""
    what = role
    if index is not None:
        what += f" {'rank' if role == 'trainer' else 'replica'} {index}"
        if of is not None:
            what += f"/{of}"
    title = f"rljob: {what}" + (f" [{job}]" if job else "")
    short = _SHORT.get(role, role.replace(" ", "-"))
    comm = f"rljob-{short}{index if index is not None else ''}"
    return Title(title, comm.encode()[:COMM_BYTES].decode(errors="ignore"))


def set_title(role: str, index: int | None = None, of: int | None = None,
              job: str | None = None) -> Title:
    """Give this process the title of `worker_title(...)` and return it."""
    import setproctitle

    title = worker_title(role, index, of, job)
    setproctitle.setproctitle(title.title)
    # the main thread's name, which top lists (setproctitle leaves it as python's)
    try:
        with open("/proc/self/comm", "w", encoding="utf-8") as comm:
            comm.write(title.comm)
    except OSError:  # not Linux: the title alone
        pass
    return title
