"""Input canaries come from one home (training.input_canaries): audit train's pool, CanaryDataset and the auditor's
secret canaries draw through it, bit for bit as before the move (digests pinned at fixed seeds)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from audit.canaries.secret import make_canaries as secret_canaries
from audit.integrations.canary_dataset import CanaryDataset
from training.config import CanaryConfig
from training.data import ImageSet
from training.input_canaries import canary_rng, noise_images, pick_sources, wrong_labels
from training.pool import make_canaries as pool_canaries

#: sha256 of each generator's (x, y[, included, order]) at these seeds, made by the code before the move (main at 657e23f)
GOLDEN = {
    "dataset/mislabel/0": "7ee6218ac0d05bda431a4e3db04acd8a9d983c76f71b7e77b382b3b9a90f06ab",
    "dataset/mislabel/5": "b45cec78c091b8c3d94e7ec085c87456899622a210abd33f6ed814abeadbe4f2",
    "dataset/ood/0": "b6ab6efa6a35e6c3485013c5aa9c11e1bbb9ecaae080a2a8a95a0fef43735fbe",
    "dataset/ood/5": "d762c3c55212981bc811fccf145b50c4bc97f32848eb519d92cc74def1b6adb2",
    "pool/mislabel/0": "db89d549d8d052073db9642a3c50589d820eecc12b8f5013f10efdaa88b2efc6",
    "pool/mislabel/3": "ee227930fced0226d343f8903d8ba029b2a49647858c01e9b40144ad29a5e07d",
    "pool/ood/0": "349d565116ed52fc70ac88a3f55e3b6127ea0cc1a605d4bb93cf05e3ab620cb5",
    "pool/ood/3": "6e88f66253cebf289cc796555d156925f0746c434580c9094df2dac5982b40bf",
    "secret/1/None": "e2ed32d62e6b9ab22c5958e55d367a2f61b0fa49ea95d6a067454ff892fcf0cb",
    "secret/2/9": "b2fed6fc9db3df79c0328f8a56deac84712c3048440462ec8eae24d5735a7941",
}


def _digest(*arrays) -> str:
    d = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        d.update(str((a.dtype, a.shape)).encode())
        d.update(a.tobytes())
    return d.hexdigest()


def _sets():
    rng = np.random.default_rng(7)
    pool = ImageSet(x=rng.integers(0, 256, (50, 6, 5, 3), dtype=np.uint8), y=rng.integers(0, 4, 50),
                    classes=tuple("abcd"), name="t", split="train")
    test = ImageSet(x=rng.integers(0, 256, (30, 6, 5, 3), dtype=np.uint8), y=rng.integers(0, 4, 30),
                    classes=tuple("abcd"), name="t", split="test")
    return pool, test


def _torch_sets():
    data = torch.utils.data.TensorDataset(torch.rand(20, 1, 4, 4, generator=torch.Generator().manual_seed(1)),
                                          torch.arange(20) % 3)
    source = torch.utils.data.TensorDataset(torch.rand(15, 1, 4, 4, generator=torch.Generator().manual_seed(2)),
                                            torch.arange(15) % 3)
    return data, source


@pytest.mark.parametrize("kind", ["mislabel", "ood"])
@pytest.mark.parametrize("seed", [0, 3])
def test_audit_train_canaries_are_bit_identical(kind, seed):
    pool, test = _sets()
    x, y, _, _ = pool_canaries(CanaryConfig(count=12, kind=kind, seed=seed), pool=pool, test=test)
    assert _digest(x, y) == GOLDEN[f"pool/{kind}/{seed}"]


@pytest.mark.parametrize("kind", ["mislabel", "ood"])
@pytest.mark.parametrize("seed", [0, 5])
def test_canary_dataset_canaries_are_bit_identical(kind, seed):
    data, source = _torch_sets()
    ds = CanaryDataset(data, count=8, kind=kind, num_classes=3, source=source, seed=seed)
    assert _digest(ds.canary_x, ds.canary_y, ds.included) == GOLDEN[f"dataset/{kind}/{seed}"]


@pytest.mark.parametrize("seed, design", [(1, None), (2, 9)])
def test_secret_canaries_are_bit_identical(seed, design):
    s = secret_canaries(count=10, num_classes=5, image_size=(4, 6), seed=seed, salt="ab" * 32, design_seed=design)
    assert _digest(s.x, s.y, s.included, s.package_order) == GOLDEN[f"secret/{seed}/{design}"]


def test_one_seed_picks_the_same_mislabelled_sources_everywhere():
    """audit train (test split) and CanaryDataset (a source dataset of the same size) draw the same items and
    shifts for one seed: both come from canary_rng."""
    pool, test = _sets()
    _, y, _, desc = pool_canaries(CanaryConfig(count=8, kind="mislabel", seed=4), pool=pool, test=test)
    source = torch.utils.data.TensorDataset(torch.zeros(30, 1, 2, 2), torch.from_numpy(test.y))
    ds = CanaryDataset(torch.utils.data.TensorDataset(torch.zeros(5, 1, 2, 2), torch.zeros(5, dtype=torch.long)),
                       count=8, kind="mislabel", num_classes=4, source=source, seed=4)
    assert ds.source_indices == desc["source_indices"] and (ds.canary_y == y).all()


def test_the_designs_invariants():
    rng = canary_rng(11)
    src = pick_sources(rng, n_source=100, count=40)
    assert len(set(src.tolist())) == 40 and (np.diff(src) > 0).all()
    true = np.arange(40) % 7
    wrong = wrong_labels(rng, true, num_classes=7)
    assert (wrong != true).all() and wrong.min() >= 0 and wrong.max() < 7
    x, y = noise_images(rng, count=2000, image_size=(1, 1), num_classes=3)
    assert x.dtype == np.uint8 and abs(x.mean() - 127.5) < 3 and set(np.unique(y)) == {0, 1, 2}
