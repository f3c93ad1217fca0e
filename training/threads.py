"""How many torch (OpenMP/MKL) threads a process trains with: the one policy, for every way we run.

Too many threads is worse than too few: on a machine whose cores are busy with other jobs, OpenMP threads spin
waiting for each other and a training loop runs several times slower (and burns several times the CPU) than
with one thread; small models gain nothing from a second thread even on an idle machine. So the policy starts
from one thread and grants more only when all of these allow it:

- **the user** did not fix the number: ``DP_AUDIT_THREADS=N`` (or ``all``: every core this process may use) or
  ``OMP_NUM_THREADS=N`` in the environment is taken as it is;
- **the cores this process may use**: the CPU affinity mask (:func:`os.sched_getaffinity`, e.g. ``taskset``,
  a batch scheduler's binding) and the cgroup CPU quota (``cpu.max``, a container's ``--cpus``), shared by the
  processes started together (``--nproc N``: the ranks on this node) or the CPUs Ray reserved for a task;
- **the cores free**: the 1-minute load average (other jobs) scaled to this process's cores; not for a Ray task,
  whose CPUs Ray has already reserved;
- **the work**: a model below :data:`PARALLEL_WORK` (parameters × input pixels × models trained at once, a rough
  count of multiply-adds per example) trains with one thread.

The plan is applied with :func:`using_threads` (restored afterwards) and recorded in the manifest's
``provenance.threads`` (:meth:`ThreadPlan.record`): the count and why.

>>> cores = Cores(available=2, source="affinity", machine=2, load=3.1)
>>> plan_threads(role="process", cores=cores, work=10**9, environ={}).threads  # loaded: one thread
1
>>> plan_threads(role="process", cores=Cores(available=4, source="affinity", machine=4, load=0.2),
...              work=10**9, environ={}).threads
4
>>> plan_threads(role="rank", cores=Cores(available=4, source="affinity", machine=4, load=2.0), processes=2,
...              work=10**9, environ={}).threads
2
>>> plan_threads(role="ray_task", cores=cores, task_cpus=2.0, work=10**9, environ={}).threads
2
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from foundation.errors import ConfigError

__all__ = ["PARALLEL_WORK", "THREADS_ENV", "LAUNCHER_OMP_ENV", "Cores", "ThreadPlan", "cgroup_cpu_quota",
           "detect_cores", "requested_threads", "model_work", "plan_threads", "ThreadBudget", "rank_budget",
           "using_threads"]

PARALLEL_WORK = 10_000_000
"""Below this work (parameters × input pixels × models at once) one thread is fastest: each operation is too
small for the threads' start and synchronisation to pay off (``results/reference/threads.md``)."""

THREADS_ENV = "DP_AUDIT_THREADS"
LAUNCHER_OMP_ENV = "DP_AUDIT_OMP_FROM_LAUNCHER"
"""Set by ``audit train --nproc`` when it put ``OMP_NUM_THREADS=1`` into the ranks' environment itself (torchrun
wants one), so that the ranks do not take it for the user's choice."""

Role = Literal["process", "rank", "ray_task"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cores:
    """The CPU cores this process may use, and how busy the machine is.

    Attributes:
        available: cores usable (affinity mask, capped by the cgroup quota; at least 1).
        source: what limited them, e.g. ``"affinity"``, ``"cgroup quota 1.5"``.
        machine: cores of the machine (``os.cpu_count()``; the load average counts them all).
        load: the 1-minute load average, None where unknown.
    """

    available: int
    source: str
    machine: int
    load: float | None = None

    def __post_init__(self) -> None:
        for name in ("available", "machine"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
        if self.load is not None and not (isinstance(self.load, (int, float)) and self.load >= 0):
            raise ValueError(f"load must be a number >= 0 or None; got {self.load!r}")

    def free(self, *, own: int) -> float:
        """Cores of :attr:`available` not busy with other jobs (``own``: runnable threads that are ours).

        >>> Cores(available=2, source="affinity", machine=2, load=2.5).free(own=1)
        0.5
        >>> Cores(available=4, source="cgroup quota 4", machine=64, load=33.0).free(own=1)
        2.0
        """
        if self.load is None:
            return float(self.available)
        busy = max(0.0, self.load - own) / self.machine  # the fraction of the machine other jobs keep busy
        return self.available * max(0.0, 1.0 - busy)


def cgroup_cpu_quota(root: str | os.PathLike[str] = "/sys/fs/cgroup") -> float | None:
    """The CPUs the cgroup quota allows (``cpu.max`` of cgroup v2, ``cpu.cfs_quota_us`` of v1); None: no quota.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); _ = (d / "cpu.max").write_text("150000 100000\\n")
    >>> cgroup_cpu_quota(d)
    1.5
    >>> _ = (d / "cpu.max").write_text("max 100000\\n"); cgroup_cpu_quota(d) is None
    True
    """
    root = Path(root)
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def detect_cores(*, affinity: set[int] | None = None, quota: float | None | Literal["detect"] = "detect",
                 machine: int | None = None, load: float | None | Literal["detect"] = "detect") -> Cores:
    """The :class:`Cores` of this process (each argument overrides what would be read from the system).

    >>> detect_cores(affinity={0, 1, 2, 3}, quota=1.5, machine=8, load=0.0)
    Cores(available=2, source='cgroup quota 1.5 of 4 cores in the affinity mask', machine=8, load=0.0)
    >>> detect_cores(affinity={0}, quota=None, machine=8, load=None).available
    1
    """
    if affinity is None:
        try:
            affinity = os.sched_getaffinity(0)
        except (AttributeError, OSError):  # not Linux
            affinity = set(range(os.cpu_count() or 1))
    mask = max(1, len(affinity))
    if quota == "detect":
        quota = cgroup_cpu_quota()
    machine = max(machine or os.cpu_count() or 1, mask)
    if load == "detect":
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = None
    if quota is not None and quota < mask:
        return Cores(available=max(1, math.ceil(quota - 1e-9)), machine=machine, load=load,
                     source=f"cgroup quota {quota:g} of {_cores(mask)} in the affinity mask")
    return Cores(available=mask, source=f"{_cores(mask)} in the affinity mask", machine=machine, load=load)


def _cores(n: int) -> str:
    return f"{n} core{'' if n == 1 else 's'}"


def requested_threads(role: Role, environ: Mapping[str, str] | None = None) -> tuple[int | Literal["all"], str] | None:
    """The thread count the user fixed in the environment, and where; None when they did not.

    ``DP_AUDIT_THREADS`` (``N`` or ``all``) first; then ``OMP_NUM_THREADS``, except in a Ray task (Ray sets it
    itself) and in a rank whose launcher set it (:data:`LAUNCHER_OMP_ENV`).

    Raises:
        ConfigError: a value that is not a positive integer (or ``all``).
    """
    env = os.environ if environ is None else environ
    names = [THREADS_ENV]
    if role != "ray_task" and env.get(LAUNCHER_OMP_ENV) != "1":
        names.append("OMP_NUM_THREADS")
    for name in names:
        raw = env.get(name, "").strip()
        if not raw:
            continue
        if name == THREADS_ENV and raw.lower() == "all":
            return "all", f"{name}=all"
        if not raw.isdigit() or int(raw) < 1:
            raise ConfigError(f"{name} must be a positive integer{' or all' if name == THREADS_ENV else ''}; "
                              f"got {raw!r} (unset it to let dp-audit choose)")
        return int(raw), f"{name}={int(raw)}"
    return None


def model_work(*, params: int, input_shape: tuple[int, ...] | list[int], models: int = 1) -> int:
    """Parameters × input pixels × models trained at once: a rough count of multiply-adds per example.

    >>> model_work(params=2_000, input_shape=(3, 8, 8), models=16)
    2048000
    """
    pixels = math.prod(int(s) for s in input_shape[-2:]) if len(input_shape) >= 2 else 1
    return int(params) * max(1, pixels) * max(1, int(models))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ThreadPlan:
    """How many torch threads, and why (recorded in ``provenance.threads``)."""

    threads: int
    reason: str
    role: Role
    cores: Cores
    processes: int = 1
    work: int | None = None

    def record(self) -> dict[str, Any]:
        """The manifest's ``provenance.threads``."""
        return {"threads": self.threads, "reason": self.reason, "role": self.role,
                "cores_available": self.cores.available, "cores_source": self.cores.source,
                "machine_cores": self.cores.machine,
                "load_average": None if self.cores.load is None else round(float(self.cores.load), 2),
                "processes": self.processes, "work": self.work}


def plan_threads(*, role: Role, cores: Cores, work: int | None, processes: int = 1, task_cpus: float | None = None,
                 environ: Mapping[str, str] | None = None) -> ThreadPlan:
    """The policy (module docstring), a pure function of what it is given.

    Args:
        role: ``process`` (one process trains), ``rank`` (one of ``processes`` ranks on this node),
            ``ray_task`` (a task that Ray gave ``task_cpus`` CPUs).
        cores: this machine's cores (:func:`detect_cores`).
        work: :func:`model_work` of what is trained; None: unknown (no cap for small models).
        processes: processes sharing ``cores`` (ranks per node); 1 otherwise.
        task_cpus: the CPUs Ray reserved for the task (``role="ray_task"``).
        environ: where to look for the user's choice (:func:`requested_threads`); default ``os.environ``.

    Raises:
        ValueError: a role, process count or task CPUs out of range.
    """
    if role not in ("process", "rank", "ray_task"):
        raise ValueError(f"role must be 'process', 'rank' or 'ray_task'; got {role!r}")
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be an integer >= 1; got {processes!r}")
    if role == "ray_task" and not (isinstance(task_cpus, (int, float)) and task_cpus > 0):
        raise ValueError(f"a ray_task needs task_cpus > 0; got {task_cpus!r}")
    if role == "ray_task":
        share = max(1, int(math.floor(task_cpus)))
        share_why = f"{task_cpus:g} CPUs reserved by Ray for the task"
    else:
        share = max(1, cores.available // processes)
        share_why = f"{_cores(cores.available)} ({cores.source})" + (
            f" shared by {processes} processes" if processes > 1 else "")

    def made(threads: int, reason: str) -> ThreadPlan:
        return ThreadPlan(threads=threads, reason=reason, role=role, cores=cores, processes=processes, work=work)

    asked = requested_threads(role, environ)
    if asked is not None:
        value, where = asked
        return made(share if value == "all" else value, f"{where} in the environment" +
                    (f": {share_why}" if value == "all" else ""))
    if work is not None and work < PARALLEL_WORK:
        return made(1, f"one thread: a small model (work {work:.2g} < {PARALLEL_WORK:.0e}) gains nothing from more")
    if share == 1:
        return made(1, f"one thread: {share_why}")
    if role == "ray_task":
        return made(share, f"{share} threads: {share_why}")
    free = cores.free(own=processes)
    per_process = int(math.floor(free / processes + 1e-9))
    threads = max(1, min(share, per_process))
    load = "unknown" if cores.load is None else f"{cores.load:.2f}"
    return made(threads, f"{threads} thread{'s' if threads > 1 else ''}: {share_why}, {free:.1f} free "
                         f"(1-minute load average {load} on {cores.machine} cores)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ThreadBudget:
    """Where a training process runs, which decides its share of the cores (:func:`plan_threads`'s arguments
    besides the work): one process, one of ``processes`` ranks on this node, or a Ray task of ``task_cpus`` CPUs.

    >>> ThreadBudget(role="ray_task", task_cpus=1.0).plan(work=None, environ={}).threads
    1
    >>> rank_budget({"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8"})
    ThreadBudget(role='rank', processes=4, task_cpus=None)
    """

    role: Role = "process"
    processes: int = 1
    task_cpus: float | None = None

    def plan(self, *, work: int | None, cores: Cores | None = None,
             environ: Mapping[str, str] | None = None) -> ThreadPlan:
        """:func:`plan_threads` for ``work`` on ``cores`` (default: this machine's now, :func:`detect_cores`)."""
        return plan_threads(role=self.role, cores=detect_cores() if cores is None else cores, work=work,
                            processes=self.processes, task_cpus=self.task_cpus, environ=environ)


def rank_budget(environ: Mapping[str, str] | None = None) -> ThreadBudget:
    """The budget of a torchrun rank: the node's cores shared by its ``LOCAL_WORLD_SIZE`` ranks."""
    env = os.environ if environ is None else environ
    try:
        local = int(env.get("LOCAL_WORLD_SIZE") or env.get("WORLD_SIZE") or 1)
    except ValueError:
        local = 1
    return ThreadBudget(role="rank", processes=max(1, local))


@contextmanager
def using_threads(plan: ThreadPlan) -> Iterator[ThreadPlan]:
    """Train with ``plan.threads`` torch threads in the ``with`` block; the previous count afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(plan.threads)
    try:
        yield plan
    finally:
        torch.set_num_threads(before)
