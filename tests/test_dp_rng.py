"""training.dp.rng: the one seed derivation is exact in integers, reproducible, and the only one."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from training.dp.rng import SEED_BITS, Stream, derive_seed, noise_generator, secret_seed, seed_noise, seeded_init

ROOT = Path(__file__).resolve().parents[1]


def test_distinct_inputs_give_distinct_seeds_including_above_bit_53():
    base = 0x1234_5678_9ABC_DEF0_1234  # > 2**64
    inputs = [(base, Stream.NOISE, 3), (base + 2**60, Stream.NOISE, 3), (base + 2**54, Stream.NOISE, 3),
              (base + 1, Stream.NOISE, 3), (base, Stream.NOISE, 3 + 2**53), (base, Stream.NOISE, 3 + 2**70),
              (base, Stream.POISSON, 3), (base, Stream.NOISE, 3, 0), (base, Stream.NOISE),
              (2**53, Stream.NOISE, 0), (2**53 + 1, Stream.NOISE, 0), (2**63 - 1, Stream.NOISE, 0),
              (2**63, Stream.NOISE, 0), (0, 2**32), (2**32, 0), (0, 1, 0), (1, 0, 0)]
    seeds = [derive_seed(*i) for i in inputs]
    assert len(set(seeds)) == len(inputs)
    assert all(0 <= s < 2**SEED_BITS for s in seeds)
    # float64 would merge these: 2**53 + 1 is not a float
    assert float(2**53) == float(2**53 + 1) and derive_seed(2**53, 1) != derive_seed(2**53 + 1, 1)


def test_seeds_are_reproducible_and_pinned():
    assert derive_seed(7, Stream.NOISE, 3) == derive_seed(7, Stream.NOISE, 3)
    assert derive_seed(7, int(Stream.NOISE), 3) == derive_seed(7, Stream.NOISE, 3)
    # golden value: a silent change of the derivation would change every run's noise and batches
    assert derive_seed(0, Stream.NOISE, 0) == 0xE7E369746316EEBD


def test_many_seeds_have_no_collision():
    seeds = {derive_seed(s, Stream.NOISE, t) for s in range(50) for t in range(200)}
    assert len(seeds) == 50 * 200


@pytest.mark.parametrize("bad", [-1, 1.0, 2.5, True, "3", None])
def test_non_integers_and_negatives_are_refused(bad):
    with pytest.raises(ValueError, match="non-negative integer"):
        derive_seed(bad, Stream.NOISE, 0)
    with pytest.raises(ValueError, match="non-negative integer"):
        derive_seed(0, Stream.NOISE, bad)


def test_noise_generators_and_init():
    a = torch.randn(5, generator=noise_generator(3, 4, "cpu"))
    b = torch.randn(5, generator=seed_noise(torch.Generator(), 3, 4))
    assert torch.equal(a, b)
    assert not torch.equal(a, torch.randn(5, generator=noise_generator(3, 5, "cpu")))
    state = torch.random.get_rng_state()
    with seeded_init(9):
        w1 = torch.rand(3)
    with seeded_init(9):
        w2 = torch.rand(3)
    assert torch.equal(w1, w2) and torch.equal(state, torch.random.get_rng_state())


def test_secret_seeds_are_fresh():
    assert len({secret_seed() for _ in range(20)}) == 20
    assert all(0 <= s < 2**SEED_BITS for s in (secret_seed() for _ in range(20)))


def test_there_is_no_second_seed_derivation_in_training():
    """Every per-step / per-stream seed in training/ goes through derive_seed (SeedSequence only in rng.py)."""
    offenders = []
    for path in sorted((ROOT / "training").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT).as_posix()
        if rel != "training/dp/rng.py" and re.search(r"SeedSequence|generate_state", text):
            offenders.append(rel)
        if re.search(r"^def (step_seed|derive_seed|_int_seed)\b", text, flags=re.M) and rel != "training/dp/rng.py":
            offenders.append(rel)
    assert offenders == []
    assert np.random.default_rng(derive_seed(1, Stream.POISSON, 0)).random() == \
        np.random.default_rng(derive_seed(1, Stream.POISSON, 0)).random()
