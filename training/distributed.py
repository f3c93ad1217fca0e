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
           "all_reduce_sum_", "barrier", "launch_command", "launch"]

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
                                         world_size=world.size)
    try:
        yield world
    finally:
        torch.distributed.destroy_process_group()


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


def launch_command(args: Sequence[str], *, nproc: int) -> list[str]:
    """The command line that runs ``audit ARGS`` in ``nproc`` processes on this machine with torchrun.

    >>> launch_command(["train", "c.yaml"], nproc=2)[1:]
    ['-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2', '-m', 'audit', 'train', 'c.yaml']
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an integer >= 1; got {nproc!r}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "audit", *args]


def launch(args: Sequence[str], *, nproc: int) -> int:
    """Run ``audit ARGS`` under torchrun with ``nproc`` processes; the exit code of the first rank that failed.

    torchrun's own report of a failed rank (a traceback of the launcher) is left out: the rank has printed
    its one-line ``error:`` already.
    """
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    options = get_args_parser().parse_args(launch_command(args, nproc=nproc)[3:])
    if nproc > 1:  # torchrun's default for several processes (it would print a banner to say so)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
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
    return 0
