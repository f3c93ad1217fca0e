"""Secure mode's randomness (training.dp.csprng): every draw is read from os.urandom, and the transforms from
random bytes to uniforms, normals, permutations and Poisson batches equal slow scalar references on the same bytes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from training.dp import csprng
from training.dp.sampling import PoissonSampler, ShuffleSampler

from test_dp_engine import cnn_batch, stepper_for, tiny_cnn


class ByteSource:
    """A stand-in for os.urandom: seeded bytes, and a record of what was handed out."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.given = b""

    @property
    def asked(self) -> int:
        return len(self.given)

    def __call__(self, n: int) -> bytes:
        out = self.rng.bytes(n)
        self.given += out
        return out


@pytest.fixture
def urandom(monkeypatch):
    """os.urandom replaced by a seeded byte stream that records how many bytes were asked for."""
    source = ByteSource(seed=0)
    monkeypatch.setattr(csprng.os, "urandom", source)
    return source


def _words(data: bytes) -> list[int]:
    return [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]


def test_uniforms_are_the_top_53_bits_of_each_word(urandom):
    u = csprng.uniform(1000)
    ref = [(w >> 11) / 2.0 ** 53 for w in _words(urandom.given)]
    assert u.tolist() == ref and urandom.asked == 8000
    assert u.min() >= 0.0 and u.max() < 1.0


def test_gaussian_equals_scalar_box_muller_of_the_same_bytes(urandom):
    g = csprng.gaussian((3, 5), 2.0, dtype=torch.float64)
    u = [(w >> 11) / 2.0 ** 53 for w in _words(urandom.given)]
    n = 15
    pairs = (4 * n + 1) // 2
    z = [0.0] * (2 * pairs)
    for i in range(pairs):  # Box–Muller, one pair at a time: cos half first, then sin half
        r = math.sqrt(-2.0 * math.log(1.0 - u[i]))
        z[i] = r * math.cos(2.0 * math.pi * u[pairs + i])
        z[pairs + i] = r * math.sin(2.0 * math.pi * u[pairs + i])
    ref = [0.5 * 2.0 * sum(z[k * n + j] for k in range(4)) for j in range(n)]
    np.testing.assert_allclose(g.reshape(-1).numpy(), ref, rtol=1e-12, atol=1e-12)


def test_gaussian_is_normal_with_the_asked_std(urandom):
    g = csprng.gaussian((100_000,), 2.5, dtype=torch.float64).numpy()
    assert abs(g.std() / 2.5 - 1.0) < 0.01 and abs(g.mean()) < 0.03
    assert stats.kstest(g / 2.5, "norm").pvalue > 0.01


def test_zero_std_reads_no_randomness(urandom):
    assert torch.equal(csprng.gaussian((4,), 0.0), torch.zeros(4)) and urandom.asked == 0


def test_secure_poisson_batches_are_uniforms_below_q(urandom):
    idx = PoissonSampler(500, 0.1, None).indices(0)
    u = np.array([(w >> 11) / 2.0 ** 53 for w in _words(urandom.given)])
    np.testing.assert_array_equal(idx, np.flatnonzero(u < 0.1))


def test_secure_shuffle_is_a_permutation_sorted_by_random_words(urandom):
    batch = ShuffleSampler(50, 10, None).indices(0)
    words = np.array(_words(urandom.given), dtype=np.uint64)
    np.testing.assert_array_equal(batch, np.argsort(words, kind="stable")[:10])
    assert sorted(csprng.permutation(50).tolist()) == list(range(50))


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_secure_dp_step_draws_its_noise_from_the_os(urandom, mode):
    x, y = cnn_batch(6)
    model = tiny_cnn()
    n_params = sum(p.numel() for p in model.parameters())
    stepper_for(model, sigma=1.0, mode=mode, secure_mode=True).step(x, y)
    # four normals per coordinate, two uniforms (16 bytes) per pair of normals: 32 bytes per coordinate
    assert urandom.asked == 32 * n_params
    reproducible = tiny_cnn()
    before = urandom.asked
    stepper_for(reproducible, sigma=1.0, mode=mode).step(x, y)
    assert urandom.asked == before  # the reproducible mode never reads the OS CSPRNG


def test_real_os_draws_differ():
    a, b = csprng.gaussian((64,), 1.0), csprng.gaussian((64,), 1.0)
    assert not torch.equal(a, b)


def test_sharded_secure_batches_are_rank_zeros_draw(urandom):
    """Secure mode over several ranks: rank 0 draws the logical batch from the OS and sends it; the shards of the
    ranks are disjoint and together the batch rank 0 drew (the others read no randomness)."""
    from training.dp.sampling import ShardedSampler

    inner = PoissonSampler(300, 0.2, None)
    sent: list[np.ndarray] = []

    def broadcast(batch):
        if batch is not None:
            sent.append(batch)
        return sent[-1]

    shards = [ShardedSampler(inner, rank=r, world_size=3, broadcast=broadcast) for r in range(3)]
    parts = [shards[0].indices(5)]
    asked = urandom.asked
    parts += [s.indices(5) for s in shards[1:]]
    assert urandom.asked == asked  # ranks 1 and 2 drew nothing
    assert sorted(np.concatenate(parts).tolist()) == sent[0].tolist()
    with pytest.raises(ValueError, match="needs a broadcast"):
        ShardedSampler(inner, rank=0, world_size=2)
