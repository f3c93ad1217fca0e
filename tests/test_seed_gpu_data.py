"""What travels to and from the GPU machine: the JPEG pack of CIFAR-10 decodes to the npz layout
(experiments/gpu/data.py); the results pack brings back JSON and the fine-tuning source's weights, no pickle."""

from __future__ import annotations

import io

import numpy as np


def test_jpeg_pack_round_trip(tmp_path):
    from PIL import Image

    from experiments.gpu import data

    rng = np.random.default_rng(0)
    shared = tmp_path / "shared"
    (shared / "cifar10").mkdir(parents=True)
    yy, xx = np.mgrid[0:32, 0:32]
    smooth = lambda k: np.stack([(xx * k + yy * c) % 256 for c in (1, 2, 3)], -1).astype(np.uint8)  # noqa: E731
    for split, n in (("train", 12), ("test", 5)):
        x = np.stack([smooth(k + 1) for k in range(n)])
        np.savez(shared / "cifar10" / f"{split}.npz", x=x, y=rng.integers(0, 10, n))
    (shared / "cifar10" / "classes.txt").write_text("\n".join(f"c{i}" for i in range(10)) + "\n")
    (shared / "food101").mkdir()  # the Ke et al. arm's slice travels in the same pack
    for split, n in (("train", 3100), ("test", 650)):
        np.savez(shared / "food101" / f"{split}.npz", x=np.stack([smooth(k % 7 + 2) for k in range(n)]),
                 y=np.arange(n) % 10)
    (shared / "food101" / "classes.txt").write_text("\n".join(f"f{i}" for i in range(10)) + "\n")
    data.pack_jpeg(shared, tmp_path / "pack.npz")
    data.unpack_jpeg(tmp_path / "pack.npz", tmp_path / "out")
    food = data._food_slice(shared)
    for split, n in (("train", 3000), ("test", 600)):
        with np.load(tmp_path / "food101" / f"{split}.npz") as b:
            assert b["x"].shape == (n, 32, 32, 3) and np.array_equal(b["y"], food[split][1])
            assert np.abs(b["x"].astype(int) - food[split][0].astype(int)).mean() < 3  # a JPEG round trip
    assert (tmp_path / "food101" / "classes.txt").read_text().split() == [f"f{i}" for i in range(10)]
    for split in ("train", "test"):
        with np.load(shared / "cifar10" / f"{split}.npz") as a, np.load(tmp_path / "out" / f"{split}.npz") as b:
            assert b["x"].shape == a["x"].shape and b["x"].dtype == np.uint8
            assert np.array_equal(a["y"], b["y"])
            for src, got in zip(a["x"], b["x"]):  # exactly what one JPEG (quality 75) round trip gives
                buf = io.BytesIO()
                Image.fromarray(src).save(buf, format="JPEG", quality=75)
                assert np.array_equal(got, np.asarray(Image.open(buf).convert("RGB")))
    assert (tmp_path / "out" / "classes.txt").read_text().split() == [f"c{i}" for i in range(10)]


def test_pack_and_unpack_carry_results_and_the_source_weights_but_no_pickle(tmp_path, monkeypatch):
    import tarfile

    from experiments.gpu import pack

    src, dst = tmp_path / "device", tmp_path / "here"
    files = {"results/seed_arms/gpu_full/parts/ganesh.s0.same.json": b"{}",
             "results/experiments-gpu-full/ft-source/manifest.json": b"{}",
             "results/experiments-gpu-full/ft-source/model.safetensors": b"weights",
             "results/experiments-gpu-full/ft-source/membership.npy": b"not packed",
             "results/experiments-gpu-full/ft-lp-e1-s0/model.safetensors": b"not packed either"}
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    monkeypatch.setattr(pack, "ROOT", src)
    monkeypatch.setattr(pack, "SIGMA_CACHE", src / "results/sigma-cache")
    monkeypatch.setattr(pack, "LOG", src / "results/seed_gpu_jobs.jsonl")
    pack.pack(tmp_path / "x.tgz")
    with tarfile.open(tmp_path / "x.tgz") as tar:
        assert sorted(tar.getnames()) == sorted(list(files)[:3])
    with tarfile.open(tmp_path / "x.tgz", "r:gz") as tar:  # then a pack someone tampered with
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(tmp_path / "y.tgz", "w:gz") as tar:
        for m, data in members + [(tarfile.TarInfo("results/evil.pkl"), b"pickle"),
                                  (tarfile.TarInfo("results/../outside.json"), b"{}")]:
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))
    monkeypatch.setattr(pack, "ROOT", dst)
    pack.unpack(tmp_path / "y.tgz")
    got = sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file())
    assert got == sorted(list(files)[:3]) and not (tmp_path / "outside.json").exists()
    assert (dst / list(files)[2]).read_bytes() == b"weights"
