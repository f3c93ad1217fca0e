"""Multi-process DP training: ``torchrun --nproc-per-node N -m audit train CONFIG`` (gloo on CPU, NCCL on GPUs).

How one logical DP-SGD step is split over N ranks (and why it is the one-process step):

- **The logical batch** of step t is the one-process batch, ``sampler.indices(t)`` (Poisson with rate q over the
  whole training set, a pure function of (seed, t), :mod:`training.dp.sampling`); rank r takes positions
  r, r+N, r+2N, ... of it (:class:`training.dp.sampling.ShardedSampler`). The union over the ranks is exactly the
  one-process batch, so q, the expected batch size B and the number of steps T, hence the accountant's ε, are
  the one-process run's.
- **Clipping** is per example, on the rank that holds it; each rank sums its clipped gradients.
- **Noise once**: as Opacus's ``DistributedDPOptimizer``, rank 0 alone adds the sampled gradient canaries and
  N(0, σ²C²) to its sum; the other ranks contribute their clipped sums as they are; an all-reduce (sum) gives
  every rank (Σ clipped + canaries + noise), divided by B, the one-process update with noise of standard
  deviation σ·C (not √N·σ·C). Every rank then takes the same optimizer step, so the models stay equal.
- **Start**: Opacus's ``DifferentiallyPrivateDistributedDataParallel`` broadcasts rank 0's parameters when a
  phase starts (every rank also initialises from the same seed).
- **Files**: rank 0 alone takes the run-directory lock, reads it and writes it (config, checkpoints,
  TensorBoard, weights, manifest). It decides whether the run is fresh, resumed or complete and sends the
  others that decision, the saved state to resume from and the final manifest (:func:`agree`,
  :func:`broadcast_object`), so the other ranks (other machines too) need no access to the run directory; a
  secure-mode secret seed is rank 0's, broadcast. Every rank reads the dataset itself.
- **Resume**: the state is saved by rank 0 at a step every rank has finished (each step ends in an
  all-reduce), so after any rank is killed (torchrun then stops the others) ``--resume`` continues from it.
- **Network**: ``audit train --nproc N`` (:func:`launch`) keeps everything on the loopback interface: torchrun's
  rendezvous store listens on 127.0.0.1 only (a socket bound there by us and handed to the store), the ranks'
  store too (served by rank 0 at ``MASTER_ADDR=127.0.0.1``, :func:`process_group`), and gloo
  (``GLOO_SOCKET_IFNAME=lo``) and NCCL (``NCCL_SOCKET_IFNAME=lo``) bind to loopback. :class:`Rendezvous` with an endpoint (``--nnodes M --rdzv-endpoint HOST:PORT``) opens the
  launch to other machines instead, as ``torchrun`` does.

>>> SINGLE.is_main, SINGLE.distributed
(True, False)
>>> world_from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
World(rank=1, size=2, local_rank=1)
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from training.device import bind_rank
from foundation.errors import UserError

__all__ = ["World", "SINGLE", "world_from_env", "current_world", "process_group", "broadcast_object", "agree",
           "all_reduce_sum_", "barrier", "Rendezvous", "LOCAL", "launch_command", "launch", "recorded_command",
           "COMMAND_ENV"]

COMMAND_ENV = "DP_AUDIT_COMMAND"
"""The command line the user ran, passed by :func:`launch` to the ranks (whose own argv is torchrun's)."""

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place among the training processes (rank 0 of 1 without torch.distributed)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes the run directory."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


SINGLE = World()


def world_from_env(environ: Mapping[str, str] | None = None) -> World:
    """The world torchrun describes in ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (one process when unset).

    Raises:
        UserError: malformed values.
    """
    env = os.environ if environ is None else environ
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise UserError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers; got {env.get('RANK')!r}/"
                        f"{env.get('WORLD_SIZE')!r}/{env.get('LOCAL_RANK')!r}") from None
    if size < 1 or not 0 <= rank < size or local < 0:
        raise UserError(f"RANK must be in [0, WORLD_SIZE) and WORLD_SIZE >= 1; got RANK={rank}, WORLD_SIZE={size}")
    return World(rank=rank, size=size, local_rank=local)


def current_world() -> World:
    """The world of the initialised default process group, else :data:`SINGLE`."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return SINGLE
    rank, size = dist.get_rank(), dist.get_world_size()
    return World(rank=rank, size=size, local_rank=int(os.environ.get("LOCAL_RANK", rank)))


@contextmanager
def process_group(world: World, *, device: str = "auto") -> Iterator[World]:
    """Join the default process group for the ``with`` block (nothing to do for one process).

    The backend is NCCL when the ranks train on CUDA (``device`` ``cuda``, or ``auto`` with a GPU: rank r uses
    ``cuda:LOCAL_RANK``), else gloo. Rendezvous comes from torchrun's environment (``MASTER_ADDR``, ...).
    """
    if not world.distributed:
        yield world
        return
    cuda = bind_rank(device, world.local_rank)
    torch.distributed.init_process_group(backend="nccl" if cuda else "gloo", rank=world.rank,
                                         world_size=world.size, store=_loopback_rank_store(world))
    try:
        yield world
    finally:
        torch.distributed.destroy_process_group()


def _loopback_rank_store(world: World, environ: Mapping[str, str] | None = None) -> Any:
    """The ranks' store when the launcher asked for one on loopback (``MASTER_ADDR`` 127.0.0.1, the agent's
    store not shared): rank 0 serves it on a socket bound to that address only, the others connect. None
    otherwise (torch's ``env://`` store, as torchrun describes it).
    """
    import ipaddress
    import socket

    env = os.environ if environ is None else environ
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not addr or not port or env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return None
    try:
        if not ipaddress.ip_address(addr).is_loopback:
            return None
    except ValueError:  # a host name: torch's store, as configured
        return None
    from torch.distributed.constants import default_pg_timeout

    if not world.is_main:
        return torch.distributed.TCPStore(addr, int(port), world.size, is_master=False, timeout=default_pg_timeout)
    sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((addr, int(port)))
    sock.listen(128)
    return torch.distributed.TCPStore(addr, int(port), world.size, is_master=True, timeout=default_pg_timeout,
                                      master_listen_fd=sock.detach())


def broadcast_object(obj: T, world: World) -> T:
    """Rank 0's ``obj`` on every rank (pickled between our own processes only)."""
    if not world.distributed:
        return obj
    box = [obj if world.is_main else None]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def agree(world: World, decide: Callable[[], T]) -> T:
    """Rank 0 runs ``decide()``; every rank returns its value, or raises the :class:`UserError` it raised."""
    outcome: tuple[str, Any] = ("ok", None)
    if world.is_main:
        try:
            outcome = ("ok", decide())
        except UserError as exc:
            outcome = ("error", exc)
            if not world.distributed:
                raise
    outcome = broadcast_object(outcome, world)
    if outcome[0] == "error":
        raise outcome[1]
    return outcome[1]


def all_reduce_sum_(tensors: Sequence[torch.Tensor], world: World) -> None:
    """Sum each tensor over the ranks, in place (nothing for one process)."""
    if world.distributed:
        for t in tensors:
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)


def barrier(world: World) -> None:
    if world.distributed:
        torch.distributed.barrier()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rendezvous:
    """Where the processes of one training meet (torchrun's ``--nnodes`` and ``--rdzv-endpoint``).

    Attributes:
        nnodes: machines taking part (each runs ``audit train --nproc N`` with the same endpoint).
        endpoint: ``HOST:PORT`` of the rendezvous store (on the first machine); None: this machine only, on
            127.0.0.1 (a free port).

    >>> Rendezvous(nnodes=2, endpoint="node0:29400").local
    False
    >>> Rendezvous(nnodes=2)
    Traceback (most recent call last):
    ...
    ValueError: nnodes=2 needs an endpoint HOST:PORT that every machine reaches (--rdzv-endpoint)
    """

    nnodes: int = 1
    endpoint: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.nnodes, bool) or not isinstance(self.nnodes, int) or self.nnodes < 1:
            raise ValueError(f"nnodes must be an integer >= 1; got {self.nnodes!r}")
        if self.endpoint is not None:
            host, _, port = self.endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"rendezvous endpoint must be HOST:PORT with a port in 1..65535; got "
                                 f"{self.endpoint!r}")
        elif self.nnodes > 1:
            raise ValueError(f"nnodes={self.nnodes} needs an endpoint HOST:PORT that every machine reaches "
                             f"(--rdzv-endpoint)")

    @property
    def local(self) -> bool:
        """This machine only, on loopback."""
        return self.endpoint is None


LOCAL = Rendezvous()


def launch_command(args: Sequence[str], *, nproc: int, rendezvous: Rendezvous = LOCAL,
                   port: int | None = None) -> list[str]:
    """The command line that runs ``audit ARGS`` in ``nproc`` processes per machine with torchrun.

    A local launch listens on 127.0.0.1 only: the rendezvous store at ``127.0.0.1:PORT`` (``port``: a free one
    when None, which torchrun picks), the ranks told ``--local-addr 127.0.0.1``. (:func:`launch` also binds the
    store's socket itself and sets the gloo/NCCL interfaces; a bare torchrun of this command binds its store on
    every interface.)

    >>> launch_command(["train", "c.yaml"], nproc=2, port=29500)[1:]  # doctest: +NORMALIZE_WHITESPACE
    ['-m', 'torch.distributed.run', '--nnodes', '1', '--nproc-per-node', '2', '--rdzv-backend', 'c10d',
     '--rdzv-endpoint', '127.0.0.1:29500', '--local-addr', '127.0.0.1', '-m', 'audit', 'train', 'c.yaml']
    >>> launch_command(["train", "c.yaml"], nproc=4, rendezvous=Rendezvous(nnodes=2, endpoint="node0:29400"))[3:11]
    ['--nnodes', '2', '--nproc-per-node', '4', '--rdzv-backend', 'c10d', '--rdzv-endpoint', 'node0:29400']
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1; got {nproc!r}")
    endpoint = rendezvous.endpoint if not rendezvous.local else f"127.0.0.1:{port or 0}"
    local = ["--local-addr", "127.0.0.1"] if rendezvous.local else []
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(rendezvous.nnodes),
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, *local,
            "-m", "audit", *args]


def recorded_command(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> str:
    """The command line to record in ``provenance.command`` for a process whose argv is ``audit ARGV``.

    A rank started by :func:`launch` records the user's command (``--nproc`` included), not torchrun's argv for
    it; a rank of a ``torchrun`` the user ran records that torchrun's shape.

    >>> recorded_command(["train", "c.yaml"], {})
    'audit train c.yaml'
    >>> recorded_command(["train", "c.yaml"], {"DP_AUDIT_COMMAND": "audit train c.yaml --nproc 2", "WORLD_SIZE": "2"})
    'audit train c.yaml --nproc 2'
    >>> recorded_command(["train", "c.yaml"], {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2"})
    'torchrun --nnodes 2 --nproc-per-node 2 -m audit train c.yaml'
    """
    import shlex

    env = os.environ if environ is None else environ
    if env.get(COMMAND_ENV):
        return env[COMMAND_ENV]
    if int(env.get("WORLD_SIZE", "1") or 1) > 1:
        return shlex.join(["torchrun", "--nnodes", env.get("GROUP_WORLD_SIZE", "1"), "--nproc-per-node",
                           env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]), "-m", "audit", *argv])
    return shlex.join(["audit", *argv])


def _loopback_store() -> tuple[Any, int]:
    """A rendezvous store server listening on 127.0.0.1 only, and its port.

    torchrun's own store would bind every interface whatever host it is given; one created first in this
    process with a loopback socket, ``multi_tenant``, is the one torchrun's agent then shares (same port).
    """
    import socket
    from datetime import timedelta

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True,
                                       master_listen_fd=sock.detach(), timeout=timedelta(seconds=60))
    return store, port


def launch(args: Sequence[str], *, nproc: int, rendezvous: Rendezvous = LOCAL, command: str | None = None) -> int:
    """Run ``audit ARGS`` under torchrun with ``nproc`` processes; the exit code of the first rank that failed.

    Args:
        args: the ``audit`` arguments of every rank.
        nproc: processes on this machine.
        rendezvous: :data:`LOCAL` (this machine, loopback only) or the machines taking part.
        command: the user's command line, recorded in the run's ``provenance.command`` (:data:`COMMAND_ENV`).

    torchrun's own report of a failed rank (a traceback of the launcher) is left out: the rank has printed
    its one-line ``error:`` already. The ranks' torch threads: :func:`training.threads.rank_budget`.
    """
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    from training.threads import LAUNCHER_OMP_ENV

    store, port, env = None, None, {}  # the ranks inherit this process's environment
    if rendezvous.local:
        store, port = _loopback_store()
        env = {name: os.environ.get(name, "lo") for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
        # the agent's second store (the ranks' own, shared by default) would listen on every interface: not
        # shared, rank 0 serves the ranks' store on 127.0.0.1 itself (:func:`process_group`)
        env.update({"MASTER_ADDR": "127.0.0.1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    if "OMP_NUM_THREADS" not in os.environ:  # torchrun would set 1 itself (with a banner); the ranks' thread
        env.update({"OMP_NUM_THREADS": "1", LAUNCHER_OMP_ENV: "1"})  # policy decides, not this
    if command is not None:
        env[COMMAND_ENV] = command
    options = get_args_parser().parse_args(launch_command(args, nproc=nproc, rendezvous=rendezvous, port=port)[3:])
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    quiet = logging.getLogger("torch.distributed.elastic")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        run(options)
    except ChildFailedError as exc:
        code = exc.get_first_failure()[1].exitcode
        return code if code > 0 else 1
    finally:
        quiet.setLevel(level)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        del store
    return 0
