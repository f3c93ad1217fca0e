"""Every random stream of DP training, derived from one integer seed by one exact function.

:func:`derive_seed` maps ``(seed, stream, *more)`` — non-negative integers of any size — to a 64-bit seed
for a ``torch.Generator`` or ``np.random.default_rng``. It hashes (BLAKE2b) an injective, length-prefixed
byte encoding of the integers, so no two inputs share an encoding (inputs differing only above bit 53, or
above bit 64, included) and nothing passes through floating point. Distinct inputs collide only when
BLAKE2b collides on 64 bits.

Streams (:class:`Stream`) separate the uses of one run seed: the model's initialisation, the Poisson and
shuffle samplers, the DP noise of each step, later phases' samplers, the tr(H) probes, a re-initialised head.
Because the noise of step t and the batch of step t are functions of (seed, t) only, a resumed run continues
bit-for-bit like the uninterrupted one.

Secure mode (``privacy.secure_mode``) draws the DP noise and the batches from the OS CSPRNG itself
(:mod:`training.dp.csprng`); its remaining streams use these derivations from a seed that is never written
anywhere: :func:`secret_seed` draws it from the operating system's CSPRNG (``secrets``) when the run (or a resumed
part of it) starts. See :mod:`training.loop` for what that means for resuming.

>>> derive_seed(7, Stream.NOISE, 3) == derive_seed(7, Stream.NOISE, 3)
True
>>> derive_seed(7, Stream.NOISE, 3) != derive_seed(7, Stream.NOISE, 4) != derive_seed(7 + 2**60, Stream.NOISE, 4)
True
>>> 0 <= derive_seed(2**200, Stream.INIT) < 2**64
True
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import numbers
import secrets
from collections.abc import Iterator

import torch

__all__ = ["Stream", "derive_seed", "secret_seed", "seed_noise", "noise_generator", "augment_generator", "seeded_init",
           "SEED_BITS"]

SEED_BITS = 64
_PERSON = b"dp-audit-seed/1"  # BLAKE2b personalisation: this derivation, version 1


class Stream(enum.IntEnum):
    """Domain separation of the random streams derived from one run seed."""

    INIT = 1  # model initialisation
    NOISE = 2  # Gaussian noise of one DP step
    POISSON = 3  # Poisson batch of one step
    SHUFFLE = 4  # permutation of one epoch
    PHASE = 5  # sampler seed of a later training phase
    HESSIAN = 6  # Hutchinson probes of tr(H) at one step
    HEAD = 7  # a re-initialised classifier
    AUGMENT = 8  # training augmentation of one step (training.augment)


def _check_nonnegative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def derive_seed(seed: int, stream: int, *more: int) -> int:
    """A 64-bit seed that is a pure, exact function of the integers ``(seed, stream, *more)``.

    Args:
        seed: the run's (or model's) seed; any non-negative integer (secure mode: a 64-bit secret).
        stream: a :class:`Stream` (or any non-negative integer tag).
        *more: further non-negative integers (the step, an epoch, a phase index).

    Returns:
        An integer in [0, 2**64), usable by ``torch.Generator.manual_seed`` and ``np.random.default_rng``.

    Raises:
        ValueError: a part is not a non-negative integer (floats are refused: no rounding anywhere).
    """
    parts = [_check_nonnegative_int("seed", seed), _check_nonnegative_int("stream", stream)]
    parts += [_check_nonnegative_int("seed part", m) for m in more]
    h = hashlib.blake2b(digest_size=SEED_BITS // 8, person=_PERSON)
    h.update(len(parts).to_bytes(4, "little"))
    for v in parts:
        raw = v.to_bytes((v.bit_length() + 7) // 8 or 1, "little")
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return int.from_bytes(h.digest(), "little")


def secret_seed() -> int:
    """A fresh 64-bit seed from the operating system's CSPRNG (secure mode); never stored or logged."""
    return secrets.randbits(SEED_BITS)


def seed_noise(generator: torch.Generator, seed: int, step: int) -> torch.Generator:
    """Seed ``generator`` for the DP noise of ``step`` (both engines call this before each step's noise)."""
    generator.manual_seed(derive_seed(seed, Stream.NOISE, step))
    return generator


def noise_generator(seed: int, step: int, device: torch.device | str) -> torch.Generator:
    """A new ``torch.Generator`` (on ``device``) seeded for the DP noise of ``step`` (:func:`seed_noise`)."""
    return seed_noise(torch.Generator(device=torch.device(device)), seed, step)


def augment_generator(seed: int, step: int) -> torch.Generator:
    """A new CPU ``torch.Generator`` for the training augmentation of ``step`` (:mod:`training.augment`).

    Both engines call this with the model's seed and the step, so they transform the same examples alike. In
    secure mode ``seed`` is the run's secret (:func:`secret_seed`): the augmentation is then unpredictable from
    anything written down, like the run's other non-noise streams.
    """
    return torch.Generator().manual_seed(derive_seed(seed, Stream.AUGMENT, step))


@contextlib.contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Run a block (model construction) with the CPU torch RNG seeded from ``derive_seed(seed, INIT)``.

    The caller's global RNG state is untouched: the block runs inside ``torch.random.fork_rng``.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, Stream.INIT))
        yield
