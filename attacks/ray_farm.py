"""Independent tasks on Ray: a local Ray started in-process, or a cluster the user already runs.

Ray is an optional dependency (``pip install 'dp-audit[ray]'``); it is imported only when a farm opens.
:func:`ray_session` connects (``address``: ``"auto"`` for the cluster this machine belongs to, ``"host:port"`` of
a head's GCS, ``"ray://host:port"`` for Ray Client), checking the address first, or starts a private local Ray
with ``local_cpus`` CPUs whose servers listen on ``bind_host`` (``127.0.0.1``); it never attaches to a cluster
nobody named, and shuts down only what it started (:mod:`attacks.ray_connect`).
:meth:`RaySession.run` sends one task per item, each asking Ray for ``cpus_per_task`` CPUs and
``gpus_per_task`` GPUs; a task that fails or whose worker dies (killed, out of memory, a lost node) is retried
up to ``max_retries`` times by Ray. Results come back in task order, whatever order the tasks finished in.

>>> RayOptions(cpus_per_task=2).gpus_per_task
0.0
>>> RayOptions(max_retries=-1)
Traceback (most recent call last):
...
ValueError: max_retries must be an integer >= 0; got -1
"""

from __future__ import annotations

import builtins
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from attacks.ray_connect import LOOPBACK, check_bind_host, connect, describe_local, redact_address, start_local
from foundation.errors import UserError

__all__ = ["RayOptions", "RaySession", "ray_session", "import_ray"]

_OPENED: list[str] = []  # where the Rays that open sessions started or joined run (innermost last)
INSTALL_HINT = "install it with pip install 'dp-audit[ray]' (or pip install ray)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayOptions:
    """Where and how Ray tasks run.

    Attributes:
        address: ``None`` (a local Ray started in-process), ``"auto"`` (the cluster this machine is part of) or
            ``"ray://host:port"`` (Ray Client).
        cpus_per_task: CPUs each task asks for (its torch threads at most: :mod:`training.threads`).
        gpus_per_task: GPUs each task asks for (0: train on CPU).
        max_retries: how often Ray re-runs a task that failed or whose worker died.
        local_cpus: CPUs of a local Ray (None: all cores); ignored when connecting to a cluster.
        bind_host: where a local Ray's servers listen: ``127.0.0.1`` (this machine only), or an IP address of
            this machine that other nodes reach (for ``ray start --address`` on them; Ray then listens on every
            interface). A cluster's own nodes choose theirs (``ray start --node-ip-address``).
    """

    address: str | None = None
    cpus_per_task: float = 1.0
    gpus_per_task: float = 0.0
    max_retries: int = 3
    local_cpus: int | None = None
    bind_host: str = LOOPBACK

    def __post_init__(self) -> None:
        if self.address is not None and (not isinstance(self.address, str) or not self.address
                                         or not (self.address == "auto" or "://" in self.address
                                                 or ":" in self.address)):
            raise ValueError(f"address must be 'auto', 'ray://host:port' or 'host:port'; got {self.address!r}")
        if not isinstance(self.cpus_per_task, (int, float)) or not self.cpus_per_task > 0:
            raise ValueError(f"cpus_per_task must be > 0; got {self.cpus_per_task!r}")
        if not isinstance(self.gpus_per_task, (int, float)) or not self.gpus_per_task >= 0:
            raise ValueError(f"gpus_per_task must be >= 0; got {self.gpus_per_task!r}")
        for name in ("max_retries", "local_cpus"):
            value = getattr(self, name)
            if value is None and name == "local_cpus":
                continue
            low = 0 if name == "max_retries" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
        object.__setattr__(self, "bind_host", check_bind_host(self.bind_host))  # any loopback: 127.0.0.1
        if self.address is not None and self.bind_host != LOOPBACK:
            raise ValueError(f"bind_host applies to a local Ray only, not to the cluster at "
                             f"{redact_address(self.address)!r} (its nodes choose theirs with ray start "
                             f"--node-ip-address); got {self.bind_host!r}")
        if self.local_cpus is not None and self.address is None and self.cpus_per_task > self.local_cpus:
            raise ValueError(f"cpus_per_task ({self.cpus_per_task}) exceeds the local Ray's local_cpus "
                             f"({self.local_cpus}): no task could ever be scheduled")


def import_ray() -> Any:
    """The ``ray`` module, or a :class:`UserError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError(f"the ray executor needs Ray, which is not installed; {INSTALL_HINT}") from None
    return ray


class RaySession:
    """An open connection to Ray (made by :func:`ray_session`); ``where`` is the Ray it runs on, as results
    record it (``local (127.0.0.1)``, the cluster's address without credentials, or ``Ray initialised by the
    caller (GCS host:port)``); ``started``: this session started a local Ray."""

    def __init__(self, ray: Any, options: RayOptions, where: str, *, started: bool = False) -> None:
        self.ray = ray
        self.options = options
        self.where = where
        self.started = started

    @property
    def joinable_at(self) -> str | None:
        """The GCS address other nodes join (``ray start --address``) when this is a local Ray started on a
        network address (``bind_host``); None otherwise."""
        if not self.started or self.options.bind_host == LOOPBACK:
            return None
        return str(self.ray.get_runtime_context().gcs_address)

    @property
    def slots(self) -> int:
        """How many tasks the cluster can run at once with the per-task resources asked for (at least 1)."""
        res = self.ray.cluster_resources()
        slots = int(res.get("CPU", 1) // self.options.cpus_per_task)
        if self.options.gpus_per_task > 0:
            slots = min(slots, int(res.get("GPU", 0) // self.options.gpus_per_task))
        return max(1, slots)

    def put(self, value: Any) -> Any:
        """Place ``value`` in Ray's object store once (tasks receive it as an argument, not copied per task)."""
        return self.ray.put(value)

    def run(self, fn: Callable[..., Any], tasks: Sequence[Any], *, shared: Any = None,
            on_done: Callable[[int], None] | None = None,
            on_result: Callable[[int, Any], None] | None = None) -> list[Any]:
        """Run ``fn(task, shared)`` for every task on Ray; return the results in task order.

        Args:
            fn: a module-level function (Ray pickles it by reference).
            tasks: one argument per task (small: it is sent with the task).
            shared: one argument every task receives (put in the object store once; a ref from :meth:`put` is
                passed as it is).
            on_done: called with a task's position in ``tasks`` each time one finishes.
            on_result: called with a task's position and its result as it comes back (before ``on_done``).

        Raises:
            UserError: a task raised one (the first such error, after its retries); other task failures are
                re-raised as Ray reports them.
        """
        ray, opt = self.ray, self.options
        if not tasks:
            return []
        remote = ray.remote(fn).options(num_cpus=opt.cpus_per_task, num_gpus=opt.gpus_per_task,
                                        max_retries=opt.max_retries, retry_exceptions=True)
        shared_ref = shared if isinstance(shared, ray.ObjectRef) else ray.put(shared)
        refs = [remote.remote(task, shared_ref) for task in tasks]
        position = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    results[position[ref]] = _get(ray, ref)
                    if on_result is not None:
                        on_result(position[ref], results[position[ref]])
                    if on_done is not None:
                        on_done(position[ref])
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        return results


def _get(ray: Any, ref: Any) -> Any:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, UserError):
            raise cause from None
        raise


@contextmanager
def ray_session(options: RayOptions) -> Iterator[RaySession]:
    """Connect to (or start) Ray for the ``with`` block; shut down only a Ray this call started.

    A Ray already initialised in this process (``ray.init`` called by the user, a test, or an enclosing
    session) is used as it is. ``options.address`` None starts a private local Ray (never one found in Ray's
    address file or ``RAY_ADDRESS``); any other address is checked (something listening, speaking gRPC) before
    Ray joins it.

    Raises:
        UserError: Ray is not installed, a local Ray cannot start, or the address cannot be used (one line
            naming it and why, within seconds).
    """
    ray = import_ray()
    stop = None
    original_print = builtins.print  # Ray's driver swaps in its own print when it shows worker logs
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
        if options.address is None:
            stop = start_local(ray, num_cpus=options.local_cpus or os.cpu_count() or 1,
                               bind_host=options.bind_host)
            where = describe_local(options.bind_host)
        else:
            stop, where = connect(ray, options.address)
        _OPENED.append(where)
    elif _OPENED:  # an enclosing session's Ray
        where = _OPENED[-1]
    else:
        where = f"Ray initialised by the caller (GCS {redact_address(ray.get_runtime_context().gcs_address)})"
    try:
        yield RaySession(ray, options, where, started=stop is not None and options.address is None)
    finally:
        if stop is not None:
            _OPENED.pop()
            stop()
        builtins.print = original_print
