"""Tests for training.data: every on-disk format is faked in tmp_path and read by the real loaders."""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

from training.data import (
    load_dataset,
)
from training.data.safe_pickle import load_restricted
from foundation.errors import DataError

DISK_DATASETS = ("npz", "cifar10", "cifar100", "svhn", "food101", "places365", "inat2021")


# ----------------------------------------------------------------------------------------- fake writers


def cifar_rows(images: np.ndarray) -> np.ndarray:
    """(N, 32, 32, 3) -> CIFAR rows (N, 3072), written with an explicit loop (the format's definition)."""
    n = len(images)
    rows = np.zeros((n, 3072), np.uint8)
    for i in range(n):
        for ch in range(3):
            for r in range(32):
                rows[i, ch * 1024 + r * 32: ch * 1024 + r * 32 + 32] = images[i, r, :, ch]
    return rows


def write_pickle(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)


def py2_pickle(obj: object) -> bytes:
    """Encode ``obj`` the way Python 2's cPickle (protocol 2) wrote the original CIFAR files: str as
    BINSTRING, numpy arrays via GLOBAL numpy.core.multiarray._reconstruct + BUILD with a raw-bytes state."""
    out = bytearray(b"\x80\x02")

    def s(b: bytes) -> None:
        out.extend((b"U" + bytes([len(b)]) if len(b) < 256 else b"T" + struct.pack("<i", len(b))) + b)

    def enc(o: object) -> None:
        if isinstance(o, bool):
            out.extend(b"\x88" if o else b"\x89")
        elif o is None:
            out.extend(b"N")
        elif isinstance(o, int):
            out.extend(b"J" + struct.pack("<i", o))
        elif isinstance(o, (str, bytes)):
            s(o.encode("latin1") if isinstance(o, str) else o)
        elif isinstance(o, list):
            out.extend(b"](")
            for v in o:
                enc(v)
            out.extend(b"e")
        elif isinstance(o, tuple):
            out.extend(b"(")
            for v in o:
                enc(v)
            out.extend(b"t")
        elif isinstance(o, dict):
            out.extend(b"}(")
            for k, v in o.items():
                enc(k)
                enc(v)
            out.extend(b"u")
        elif isinstance(o, np.ndarray):
            out.extend(b"cnumpy.core.multiarray\n_reconstruct\n(cnumpy\nndarray\n")
            enc((0,))
            s(b"b")
            out.extend(b"tR(")
            enc(1)
            enc(tuple(o.shape))
            out.extend(b"cnumpy\ndtype\n(")
            s(o.dtype.str[1:].encode())
            enc(0)
            enc(1)
            out.extend(b"tR")
            enc((3, o.dtype.str[0], None, None, None, -1, -1, 0))
            out.extend(b"b")
            enc(False)
            s(np.ascontiguousarray(o).tobytes())
            out.extend(b"tb")
        else:
            raise TypeError(type(o))

    enc(obj)
    out.extend(b".")
    return bytes(out)


def make_cifar10(root: Path, rng: np.random.Generator, *, per_batch: int = 2, n_test: int = 3,
                 py2: bool = False) -> tuple[dict, dict]:
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    names = [f"name{i}" for i in range(10)]
    truth: dict[str, list] = {"train_x": [], "train_y": [], "test_x": [], "test_y": []}
    for fname, n, key in [*[(f"data_batch_{i}", per_batch, "train") for i in range(1, 6)],
                          ("test_batch", n_test, "test")]:
        imgs = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, n)]
        truth[f"{key}_x"].append(imgs)
        truth[f"{key}_y"].extend(labels)
        batch = {"batch_label": f"batch {fname}", "labels": labels, "data": cifar_rows(imgs),
                 "filenames": [f"img_{j}.png" for j in range(n)]}
        if py2:
            (base / fname).write_bytes(py2_pickle(batch))
        else:
            write_pickle(base / fname, {k.encode(): v for k, v in batch.items()})
    meta = {"num_cases_per_batch": per_batch, "label_names": names, "num_vis": 3072}
    if py2:
        (base / "batches.meta").write_bytes(py2_pickle(meta))
    else:
        write_pickle(base / "batches.meta", {k.encode(): v for k, v in meta.items()})
    train = {"x": np.concatenate(truth["train_x"]), "y": np.array(truth["train_y"]), "classes": tuple(names)}
    test = {"x": np.concatenate(truth["test_x"]), "y": np.array(truth["test_y"]), "classes": tuple(names)}
    return train, test


def save_png(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, format="PNG")


def save_jpeg(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, format="JPEG", quality=95)


def color_of(label: int, k: int) -> tuple[int, int, int]:
    return (20 + 40 * label, 200 - 30 * k, 60 + 50 * (k % 3))


# -------------------------------------------------------------------------------------------- CIFAR


@pytest.mark.parametrize("py2", [False, True], ids=["py3-protocol2", "py2-cpickle"])
def test_cifar10_torchvision_format_round_trips(tmp_path, py2):
    train, test = make_cifar10(tmp_path, np.random.default_rng(1), py2=py2)
    for split, truth in [("train", train), ("test", test)]:
        s = load_dataset("cifar10", root=tmp_path, split=split)
        assert s.x.dtype == np.uint8 and s.y.dtype == np.int64
        np.testing.assert_array_equal(s.x, truth["x"])
        np.testing.assert_array_equal(s.y, truth["y"])
        assert s.classes == truth["classes"] and (s.name, s.split) == ("cifar10", split)
    # the archive's own folder works as root too
    s = load_dataset("cifar10", root=tmp_path / "cifar-10-batches-py", split="test")
    np.testing.assert_array_equal(s.x, test["x"])


def test_cifar10_missing_batch_names_file(tmp_path):
    make_cifar10(tmp_path, np.random.default_rng(0))
    (tmp_path / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(DataError, match="data_batch_4 .file missing.*expected"):
        load_dataset("cifar10", root=tmp_path)
    load_dataset("cifar10", root=tmp_path, split="test")  # the test split does not need it


def test_cifar100_fine_labels(tmp_path):
    rng = np.random.default_rng(2)
    base = tmp_path / "cifar-100-python"
    fine = [f"fine{i}" for i in range(100)]
    write_pickle(base / "meta", {b"fine_label_names": fine, b"coarse_label_names": [f"c{i}" for i in range(20)]})
    truth = {}
    for split, n in [("train", 5), ("test", 3)]:
        imgs = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 100, n)]
        coarse = [v // 5 for v in labels]
        write_pickle(base / split, {b"filenames": [b"f"] * n, b"batch_label": b"b", b"fine_labels": labels,
                                    b"coarse_labels": coarse, b"data": cifar_rows(imgs)})
        truth[split] = (imgs, labels)
    for split, (imgs, labels) in truth.items():
        s = load_dataset("cifar100", root=tmp_path, split=split)
        np.testing.assert_array_equal(s.x, imgs)
        assert s.y.tolist() == labels and s.classes == tuple(fine)


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused(tmp_path):
    make_cifar10(tmp_path, np.random.default_rng(0))
    marker = tmp_path / "pwned"
    write_pickle(tmp_path / "cifar-10-batches-py" / "test_batch",
                 {b"data": _Evil(marker), b"labels": [0]})
    with pytest.raises(DataError, match=r"refusing to unpickle .*test_batch.*(posix|os)\.system"):
        load_dataset("cifar10", root=tmp_path, split="test")
    assert not marker.exists()


@pytest.mark.parametrize("payload, pattern", [
    (pickle.dumps(eval, protocol=2), r"(__builtin__|builtins)\.eval"),
    (pickle.dumps(np.array([1, "a"], dtype=object), protocol=2), "object dtype"),
    (b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00xX\x05\x00\x00\x00rot13\x86R.", "only latin-1"),
    (pickle.dumps({b"data": np.zeros(3, np.uint8)}, protocol=2)[:-20], "truncated or corrupt"),
], ids=["eval", "object-dtype", "codec", "truncated"])
def test_restricted_unpickler_refuses(payload, pattern):
    import io

    with pytest.raises(DataError, match=pattern):
        load_restricted(io.BytesIO(payload), source="x")


def test_cifar_truncated_batch_is_a_data_error(tmp_path):
    make_cifar10(tmp_path, np.random.default_rng(0))
    f = tmp_path / "cifar-10-batches-py" / "test_batch"
    f.write_bytes(f.read_bytes()[:5000])
    with pytest.raises(DataError, match="truncated or corrupt"):
        load_dataset("cifar10", root=tmp_path, split="test")


def test_cifar10_download_flow(tmp_path, monkeypatch):
    """download=True calls torchvision's archive downloader (stubbed here: importing torchvision costs ~10 s and
    nothing may touch the network), then reads what it extracted; download=False never calls it."""
    import sys
    import types

    calls = []

    def fake_download(url, download_root, filename=None, md5=None, **kw):
        calls.append((url, filename, md5))
        make_cifar10(Path(download_root), np.random.default_rng(5))

    tv = types.ModuleType("torchvision")
    tvd = types.ModuleType("torchvision.datasets")
    tvu = types.ModuleType("torchvision.datasets.utils")
    tvd.CIFAR10 = types.SimpleNamespace(url="https://example/c10.tgz", filename="cifar-10-python.tar.gz",
                                        tgz_md5="abc")
    tvu.download_and_extract_archive = fake_download
    tv.datasets, tvd.utils = tvd, tvu
    for mod in (tv, tvd, tvu):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    with pytest.raises(DataError, match="--download"):
        load_dataset("cifar10", root=tmp_path / "c10", split="test")
    assert calls == []
    s = load_dataset("cifar10", root=tmp_path / "c10", split="test", download=True)
    assert len(s) == 3 and calls == [("https://example/c10.tgz", "cifar-10-python.tar.gz", "abc")]
    tvu.download_and_extract_archive = lambda *a, **k: (_ for _ in ()).throw(OSError("no network"))
    with pytest.raises(DataError, match="download into .* failed .*no network"):
        load_dataset("cifar10", root=tmp_path / "other", download=True)
    with pytest.raises(DataError, match="cannot be downloaded"):
        load_dataset("npz", root=tmp_path, download=True)


# -------------------------------------------------------------------------------------------- SVHN


def test_svhn_mat_round_trip_and_zero_label(tmp_path):
    rng = np.random.default_rng(3)
    truth = {}
    for split, n in [("train", 6), ("test", 4), ("extra", 2)]:
        X = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
        y = rng.integers(1, 11, (n, 1)).astype(np.uint8)
        y[0, 0] = 10
        scipy.io.savemat(tmp_path / f"{split}_32x32.mat", {"X": X, "y": y})
        truth[split] = (X, y)
    for split, (X, y) in truth.items():
        s = load_dataset("svhn", root=tmp_path, split=split)
        for i in range(len(s)):
            np.testing.assert_array_equal(s.x[i], X[:, :, :, i])
        expected = [0 if int(v) == 10 else int(v) for v in y[:, 0]]
        assert s.y.tolist() == expected and s.y[0] == 0 and s.classes == tuple("0123456789")


def test_svhn_bad_mat_is_data_error(tmp_path):
    scipy.io.savemat(tmp_path / "train_32x32.mat", {"X": np.zeros((32, 32, 3, 2), np.uint8),
                                                    "y": np.array([[1], [11]], np.uint8)})
    with pytest.raises(DataError, match="must lie in 1..10"):
        load_dataset("svhn", root=tmp_path)
    (tmp_path / "test_32x32.mat").write_bytes(b"not a mat file at all" * 10)
    with pytest.raises(DataError, match="svhn: cannot read"):
        load_dataset("svhn", root=tmp_path, split="test")


# -------------------------------------------------------------------------------------------- Food-101


def make_food101(root: Path, *, use_json: bool = True) -> dict[str, list[tuple[int, tuple[int, int, int]]]]:
    base = root / "food-101"
    classes = ["apple_pie", "baklava", "churros"]
    (base / "meta").mkdir(parents=True)
    (base / "meta" / "classes.txt").write_text("\n".join(classes) + "\n")
    truth: dict[str, list] = {}
    for split, per_class in [("train", 3), ("test", 2)]:
        listing: dict[str, list[str]] = {}
        truth[split] = []
        for cls in ["churros", "apple_pie", "baklava"]:  # json order differs from classes.txt order
            label = classes.index(cls)
            for k in range(per_class):
                rel = f"{cls}/{1000 * label + 10 * k + (split == 'test')}"
                save_jpeg(base / "images" / f"{rel}.jpg", color_of(label, k))
                listing.setdefault(cls, []).append(rel)
                truth[split].append((label, color_of(label, k)))
        if use_json:
            (base / "meta" / f"{split}.json").write_text(json.dumps(listing))
        else:
            (base / "meta" / f"{split}.txt").write_text("\n".join(r for v in listing.values() for r in v) + "\n")
    return truth


@pytest.mark.parametrize("use_json", [True, False], ids=["json", "txt"])
def test_food101_layout_labels_and_decode(tmp_path, use_json):
    truth = make_food101(tmp_path, use_json=use_json)
    for split in ("train", "test"):
        s = load_dataset("food101", root=tmp_path, split=split)
        assert s.x.shape == (len(truth[split]), 32, 32, 3) and s.classes == ("apple_pie", "baklava", "churros")
        assert s.y.tolist() == [label for label, _ in truth[split]]
        means = s.x.reshape(len(s), -1, 3).mean(axis=1)
        np.testing.assert_allclose(means, [c for _, c in truth[split]], atol=3)  # JPEG of a flat colour
    s = load_dataset("food101", root=tmp_path / "food-101", split="test", image_size=12)
    assert s.x.shape == (6, 12, 12, 3)


def test_food101_unknown_class_in_meta(tmp_path):
    make_food101(tmp_path)
    (tmp_path / "food-101" / "meta" / "classes.txt").write_text("apple_pie\nbaklava\n")
    with pytest.raises(DataError, match="classes not in .*classes.txt: churros"):
        load_dataset("food101", root=tmp_path)


def test_folder_limit_decodes_only_returned_files(tmp_path):
    truth = make_food101(tmp_path)
    # limit=6 over 3 classes keeps images k=0,1 of each class; corrupt every k=2 image, which it must not touch
    for rel in ("churros/2020", "apple_pie/20", "baklava/1020"):
        (tmp_path / "food-101" / "images" / f"{rel}.jpg").write_bytes(b"garbage")
    s = load_dataset("food101", root=tmp_path, split="train", limit=6)
    assert s.y.tolist() == [2, 2, 0, 0, 1, 1]
    kept = [c for j, (_, c) in enumerate(truth["train"]) if j % 3 != 2]
    np.testing.assert_allclose(s.x.reshape(6, -1, 3).mean(axis=1), kept, atol=3)
    with pytest.raises(DataError, match=r"cannot decode image .*churros.2020\.jpg"):
        load_dataset("food101", root=tmp_path, split="train")


# -------------------------------------------------------------------------------------------- Places365


def make_places(root: Path) -> dict[str, list[int]]:
    cats = ["/a/airfield", "/b/bakery/shop", "/c/canyon"]
    (root).mkdir(parents=True, exist_ok=True)
    (root / "categories_places365.txt").write_text("".join(f"{c} {i}\n" for i, c in enumerate(cats)))
    train_lines, labels_train = [], []
    for label, cat in enumerate(cats):
        for k in range(2):
            rel = f"{cat}/{k + 1:08d}.jpg"
            save_jpeg(root / "data_256_standard" / rel.lstrip("/"), color_of(label, k), size=(32, 32))
            train_lines.append(f"{rel} {label}")
            labels_train.append(label)
    val_labels = [2, 0, 1, 2]
    val_lines = []
    for k, label in enumerate(val_labels):
        name = f"Places365_val_{k + 1:08d}.jpg"
        save_jpeg(root / "val_256" / name, color_of(label, k), size=(48, 32))
        val_lines.append(f"{name} {label}")
    (root / "places365_train_standard.txt").write_text("\n".join(train_lines) + "\n")
    (root / "places365_val.txt").write_text("\n".join(val_lines) + "\n")
    return {"train-standard": labels_train, "val": val_labels}


def test_places365_layout_and_aliases(tmp_path):
    truth = make_places(tmp_path)
    s = load_dataset("places365", root=tmp_path, split="train")
    assert s.split == "train-standard" and s.y.tolist() == truth["train-standard"]
    assert s.classes == ("airfield", "bakery/shop", "canyon")
    means = s.x.reshape(len(s), -1, 3).mean(axis=1)
    np.testing.assert_allclose(means, [color_of(lab, k % 2) for k, lab in enumerate(truth["train-standard"])],
                               atol=3)
    v = load_dataset("places365", root=tmp_path, split="test", image_size=16)
    assert v.split == "val" and v.y.tolist() == truth["val"] and v.x.shape == (4, 16, 16, 3)
    (tmp_path / "val_256").rename(tmp_path / "val_large")
    assert load_dataset("places365", root=tmp_path, split="val").y.tolist() == truth["val"]
    with pytest.raises(DataError, match=r"places365_train_challenge\.txt \(file missing\)"):
        load_dataset("places365", root=tmp_path, split="train-challenge")


# -------------------------------------------------------------------------------------------- iNat 2021


def make_inat(root: Path, rng: np.random.Generator, split: str = "2021_train_mini") -> list[np.ndarray]:
    names = ["00000_Animalia_Arthropoda_Insecta_Lepidoptera_Geometridae_Acasis_viretata",
             "00001_Plantae_Tracheophyta_Magnoliopsida_Rosales_Rosaceae_Rosa_canina",
             "00002_Fungi_Basidiomycota_Agaricomycetes_Agaricales_Amanitaceae_Amanita_muscaria"]
    per_class = []
    for i, name in enumerate(names):
        imgs = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(i + 1)]
        for k, img in enumerate(imgs):
            save_png(root / split / name / f"{k:02d}.png", img)
        per_class.append(imgs)
    return per_class


def test_inat2021_label_from_folder_prefix_exact_pixels(tmp_path):
    per_class = make_inat(tmp_path, np.random.default_rng(4))
    (tmp_path / "2021_train_mini" / "README.txt").write_text("not a category")
    s = load_dataset("inat2021", root=tmp_path, split="train_mini")
    assert s.y.tolist() == [0, 1, 1, 2, 2, 2]
    np.testing.assert_array_equal(s.x, np.stack([img for imgs in per_class for img in imgs]))  # PNG, 32x32
    assert s.classes[2] == "Fungi_Basidiomycota_Agaricomycetes_Agaricales_Amanitaceae_Amanita_muscaria"
    make_inat(tmp_path, np.random.default_rng(5), split="2021_valid")
    assert load_dataset("inat2021", root=tmp_path, split="test").split == "valid"


def test_inat2021_gap_in_category_ids(tmp_path):
    make_inat(tmp_path, np.random.default_rng(4))
    folder = tmp_path / "2021_train_mini"
    old = next(folder.glob("00001_*"))
    old.rename(folder / old.name.replace("00001_", "00007_"))
    with pytest.raises(DataError, match="without gaps; expected 00001, found 00002"):
        load_dataset("inat2021", root=tmp_path, split="train_mini")
