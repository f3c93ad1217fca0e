"""Tests for training.data's registry and in-memory side: dataset names and their contract, npz arrays, the built-in
sets, the pool and its fingerprint, ImageSet, and the real data in ../shared when it is there. Each on-disk format
is faked and read in tests/test_datasets.py."""

from __future__ import annotations

from pathlib import Path
from foundation.shared_root import missing_reason, shared_root

import numpy as np
import pytest
from PIL import Image

from training.config import DataConfig
from training.data import (DATASETS, DatasetSpec, ImageSet, Registry, concat_sets, fit_image, limit_indices,
                           load_dataset, load_pool, load_test, pool_indices, to_float_tensor)
from foundation.errors import DataError

from test_datasets import DISK_DATASETS, make_food101

SHARED_DATA = shared_root() / "data"  # $DP_AUDIT_SHARED, default ../shared

# -------------------------------------------------------------------------------------------- registry


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(DataError) as err:
        load_dataset("imagenet")
    for name in DATASETS:
        assert name in str(err.value)


def test_registry_names_and_duplicates():
    assert DATASETS.names() == ("digits", "synthetic", "npz", "cifar10", "cifar100", "svhn", "food101",
                                "places365", "inat2021")
    reg = Registry([DATASETS["digits"]])
    with pytest.raises(ValueError, match="already registered"):
        reg.register(DATASETS["digits"])
    assert "digits" in reg and "cifar10" not in reg


@pytest.mark.parametrize("name", list(DATASETS.names()))
def test_every_entry_keeps_the_contract(name):
    spec = DATASETS[name]
    assert isinstance(spec, DatasetSpec) and spec.name == name and spec.splits and spec.expected_layout
    for split in spec.splits:
        assert spec.resolve_split(split) == split
    for alias, canonical in spec.aliases.items():
        assert spec.resolve_split(alias) == canonical
    with pytest.raises(DataError, match="unknown split 'nonsense!'.*valid splits"):
        spec.resolve_split("nonsense!")


@pytest.mark.parametrize("name", DISK_DATASETS)
def test_missing_root_names_path_and_layout(name, tmp_path):
    spec = DATASETS[name]
    empty = tmp_path / "nothing_here"
    with pytest.raises(DataError) as err:
        load_dataset(name, root=empty)
    msg = str(err.value)
    assert msg.startswith(f"{name}: no data at {empty}") and spec.layout(empty) in msg
    with pytest.raises(DataError, match=f"{name}: no data root given; set data.root"):
        load_dataset(name)
    empty.mkdir()
    with pytest.raises(DataError, match="expected"):
        load_dataset(name, root=empty)


# -------------------------------------------------------------------------------------------- npz


def test_npz_file_and_folder(tmp_path):
    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, (7, 5, 6, 3), dtype=np.uint8)
    y = np.array([0, 2, 1, 2, 0, 1, 2])
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "test.npz", x=x[:3], y=y[:3])
    (tmp_path / "classes.txt").write_text("cat\ndog\nemu\n")
    s = load_dataset("npz", root=tmp_path)
    np.testing.assert_array_equal(s.x, x)
    assert s.y.tolist() == y.tolist() and s.classes == ("cat", "dog", "emu")
    single = load_dataset("npz", root=tmp_path / "train.npz")
    assert single.fingerprint() == s.fingerprint()
    with pytest.raises(DataError, match="single file.*set data.test_split: null"):
        load_dataset("npz", root=tmp_path / "train.npz", split="test")
    assert len(load_dataset("npz", root=tmp_path, split="test")) == 3
    # the same folder serves every disk dataset through the npz layout
    assert load_dataset("svhn", root=tmp_path).fingerprint() == s.fingerprint()
    assert load_dataset("inat2021", root=tmp_path, split="valid").split == "valid"


@pytest.mark.parametrize("arrays, pattern", [
    ({"x": np.zeros((2, 4, 4, 3), np.float32), "y": np.zeros(2, np.int64)}, "must be uint8"),
    ({"x": np.zeros((2, 4, 4), np.uint8), "y": np.zeros(2, np.int64)}, r"shape \(N, H, W, 3\)"),
    ({"x": np.zeros((2, 4, 4, 3), np.uint8)}, "lacks array.* y"),
    ({"x": np.zeros((2, 4, 4, 3), np.uint8), "y": np.zeros(3, np.int64)}, r"must have shape \(2,\)"),
    ({"x": np.zeros((2, 4, 4, 3), np.uint8), "y": np.array([0.5, 1.0])}, "integer labels"),
    ({"x": np.zeros((2, 4, 4, 3), np.uint8), "y": np.array([0, 5])}, r"must lie in \[0, 3\)"),
    ({"x": np.zeros((2, 4, 4, 3), np.uint8), "y": np.array([{"a": 1}, 2], dtype=object)}, "without unpickling"),
])
def test_npz_validation(tmp_path, arrays, pattern):
    np.savez(tmp_path / "train.npz", **arrays)
    (tmp_path / "classes.txt").write_text("a\nb\nc\n")
    with pytest.raises(DataError, match=pattern):
        load_dataset("npz", root=tmp_path)


def test_npz_rejects_path_like_split(tmp_path):
    with pytest.raises(DataError, match="unknown split"):
        load_dataset("npz", root=tmp_path, split="../secret")


# -------------------------------------------------------------------------------------------- built-ins


def test_digits_shape_split_and_pixels():
    from sklearn.datasets import load_digits

    train, test = load_dataset("digits"), load_dataset("digits", split="test")
    assert train.x.shape == (1347, 8, 8, 3) and test.x.shape == (450, 8, 8, 3)
    assert train.classes == tuple(str(i) for i in range(10))
    assert np.array_equal(train.x[..., 0], train.x[..., 2]) and train.x.max() == 255
    ref = load_digits()
    counts = np.bincount(ref.target, minlength=10)
    assert np.bincount(test.y, minlength=10).tolist() == [int(round(c / 4)) for c in counts]
    # each split is a subsequence of the bundled order: match rows back to the originals
    orig = np.rint(ref.images * 255 / 16).astype(np.uint8)
    keys = {orig[i].tobytes() + bytes([ref.target[i]]) for i in range(len(orig))}
    both = [train.x[i, ..., 0].tobytes() + bytes([train.y[i]]) for i in range(len(train))]
    both += [test.x[i, ..., 0].tobytes() + bytes([test.y[i]]) for i in range(len(test))]
    assert set(both) <= keys and len(both) == len(orig)


def test_synthetic_seeded_and_options():
    a = load_dataset("synthetic", split="train:n=40,classes=4,seed=7")
    b = load_dataset("synthetic", split="train:n=40,classes=4,seed=7")
    c = load_dataset("synthetic", split="test:n=40,classes=4,seed=7")
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert a.x.shape == (40, 8, 8, 3) and np.bincount(a.y).tolist() == [10] * 4
    d = load_dataset("synthetic", image_size=12)
    assert d.x.shape == (1000, 12, 12, 3) and len(load_dataset("synthetic", split="test")) == 500
    # class-conditional: each image is nearer its own class mean than any other
    means = np.stack([a.x[a.y == k].mean(0) for k in range(4)]).reshape(4, -1)
    dist = ((a.x.reshape(40, 1, -1) - means[None]) ** 2).sum(-1)
    assert (dist.argmin(1) == a.y).mean() > 0.9
    with pytest.raises(DataError, match="bad split option 'bogus=1'"):
        load_dataset("synthetic", split="train:bogus=1")
    with pytest.raises(DataError, match="takes none"):
        load_dataset("digits", split="train:n=3")


# -------------------------------------------------------------------------------------------- pool


def test_pool_reproducible_and_equals_subset(tmp_path):
    cfg = DataConfig(dataset="digits", pool_size=200, pool_seed=11)
    p1, p2 = load_pool(cfg), load_pool(cfg)
    assert len(p1) == 200 and p1.fingerprint() == p2.fingerprint()
    assert load_pool(cfg.model_copy(update={"pool_seed": 12})).fingerprint() != p1.fingerprint()
    full = load_dataset("digits")
    idx = pool_indices(len(full), 200, 11)
    assert np.all(np.diff(idx) > 0)
    ref = full.subset(np.sort(np.random.default_rng(11).choice(len(full), 200, replace=False)))
    assert ref.fingerprint() == p1.fingerprint()
    assert load_pool(DataConfig(dataset="digits")).fingerprint() == full.fingerprint()
    with pytest.raises(DataError, match="pool_size=5000 .* only 1347"):
        load_pool(DataConfig(dataset="digits", pool_size=5000))


def test_pool_from_folder_dataset_matches_full_load(tmp_path):
    make_food101(tmp_path)
    cfg = DataConfig(dataset="food101", root=str(tmp_path), pool_size=4, pool_seed=3, image_size=8,
                     test_size=2)
    pool = load_pool(cfg)
    full = load_dataset("food101", root=tmp_path, image_size=8)
    assert pool.fingerprint() == full.subset(pool_indices(len(full), 4, 3)).fingerprint()
    test = load_test(cfg)
    assert test is not None and len(test) == 2 and test.x.shape[1:] == (8, 8, 3)
    assert len(load_test(cfg.model_copy(update={"test_size": 100}))) == 6
    assert load_test(cfg.model_copy(update={"test_split": None})) is None
    with pytest.raises(DataError, match="is the training split"):
        load_test(cfg.model_copy(update={"test_split": "train"}))


def test_fingerprint_changes_with_data(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (5, 4, 4, 3), dtype=np.uint8)
    y = np.array([0, 1, 0, 1, 0])
    np.savez(tmp_path / "train.npz", x=x, y=y)
    before = load_pool(DataConfig(dataset="npz", root=str(tmp_path))).fingerprint()
    x2 = x.copy()
    x2[3, 1, 2, 0] ^= 1
    np.savez(tmp_path / "train.npz", x=x2, y=y)
    after_x = load_pool(DataConfig(dataset="npz", root=str(tmp_path))).fingerprint()
    np.savez(tmp_path / "train.npz", x=x, y=np.array([0, 1, 0, 1, 1]))
    after_y = load_pool(DataConfig(dataset="npz", root=str(tmp_path))).fingerprint()
    assert len({before, after_x, after_y}) == 3


# -------------------------------------------------------------------------------------------- ImageSet


def test_limit_indices_matches_round_robin_reference():
    rng = np.random.default_rng(9)
    for _ in range(20):
        y = rng.integers(0, 5, rng.integers(1, 40))
        limit = int(rng.integers(1, len(y) + 2))
        queues = {c: [i for i in range(len(y)) if y[i] == c] for c in sorted(set(y.tolist()))}
        chosen: list[int] = []
        while len(chosen) < min(limit, len(y)):
            for c in queues:
                if queues[c] and len(chosen) < limit:
                    chosen.append(queues[c].pop(0))
        assert limit_indices(y, limit).tolist() == sorted(chosen)


def test_imageset_is_immutable_and_validates():
    s = load_dataset("synthetic", split="train:n=10,classes=2")
    with pytest.raises(ValueError):
        s.x[0, 0, 0, 0] = 1
    mask = s.y == 1
    assert s.subset(mask).y.tolist() == [1] * int(mask.sum())
    with pytest.raises(ValueError, match="must lie in"):
        ImageSet(x=np.zeros((1, 2, 2, 3), np.uint8), y=np.array([2]), classes=("a", "b"), name="t", split="t")
    with pytest.raises(TypeError, match="uint8"):
        ImageSet(x=np.zeros((1, 2, 2, 3)), y=np.array([0]), classes=("a",), name="t", split="t")
    both = concat_sets([s, s.subset([0])], split="all")
    assert len(both) == 11 and both.split == "all"


def test_to_float_tensor_layout_and_range():
    x = np.random.default_rng(1).integers(0, 256, (3, 5, 4, 3), dtype=np.uint8)
    t = to_float_tensor(x)
    assert tuple(t.shape) == (3, 3, 5, 4) and str(t.dtype) == "torch.float32"
    assert float(t.min()) >= 0.0 and float(t.max()) <= 1.0
    for i, c, h, w in [(0, 0, 0, 0), (2, 1, 4, 3), (1, 2, 3, 1)]:
        assert float(t[i, c, h, w]) == pytest.approx(x[i, h, w, c] / 255.0)
    with pytest.raises(TypeError):
        to_float_tensor(x.astype(np.float32))


def test_fit_image_centre_crop_and_resized():
    img = np.zeros((32, 96, 3), np.uint8)
    img[:, :32] = (255, 0, 0)
    img[:, 32:64] = (0, 255, 0)
    img[:, 64:] = (0, 0, 255)
    out = fit_image(Image.fromarray(img), 32)
    np.testing.assert_array_equal(out, img[:, 32:64])
    s = load_dataset("digits", limit=10)
    assert s.resized(8) is s and s.resized(20).x.shape == (10, 20, 20, 3)
    flat = ImageSet(x=np.full((1, 4, 4, 3), 77, np.uint8), y=np.array([0]), classes=("a",), name="t", split="t")
    assert np.all(flat.resized(9).x == 77)


# -------------------------------------------------------------------------------------------- real data


@pytest.mark.skipif(not (SHARED_DATA / "cifar10_exact").is_dir(),
                    reason=missing_reason("data/cifar10_exact"))
def test_real_cifar10_exact_loads_via_npz_layout():
    root = SHARED_DATA / "cifar10_exact"
    train = load_dataset("cifar10", root=root)
    test = load_dataset("cifar10", root=root, split="test")
    assert train.x.shape == (5438, 32, 32, 3) and test.x.shape == (1017, 32, 32, 3)
    assert train.classes[:2] == ("airplane", "automobile") and len(train.classes) == 10
    with np.load(root / "test.npz") as npz:
        np.testing.assert_array_equal(test.x, npz["x"])
        np.testing.assert_array_equal(test.y, npz["y"])
    pool = load_pool(DataConfig(dataset="cifar10", root=str(root), pool_size=64, pool_seed=0))
    assert len(pool) == 64 and set(pool.y.tolist()) <= set(range(10))
