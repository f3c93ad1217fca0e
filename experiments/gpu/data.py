"""The data :mod:`experiments.gpu` sends to the GPU machine, which takes a 64 MiB working tree and nothing else:
``prepare`` writes ``.device_data/`` as arrays (the ``gpu`` scale's slice), ``pack_jpeg`` all of CIFAR-10 and a
Food-101 slice as JPEG in ~52 MiB (the ``gpu_full`` scale), ``unpack_jpeg`` decodes that on the device into the
npz layout every loader reads. Every draw is seeded."""

from __future__ import annotations

from pathlib import Path

from experiments.paths import ROOT
DATA = ROOT / ".device_data"


def prepare(shared: Path) -> None:
    """Write ``.device_data/`` from the shared arrays (see the module docstring)."""
    import shutil

    import numpy as np

    def save(folder: Path, split: str, x, y) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / f"{split}.npz", x=x, y=y)

    for name in ("cifar10", "cifar10_public", "food101"):  # what this writes; a JPEG pack beside it stays
        shutil.rmtree(DATA / name, ignore_errors=True)
    with np.load(shared / "cifar10/train.npz") as tr, np.load(shared / "cifar10/test.npz") as te:
        xtr, ytr, xte, yte = tr["x"], tr["y"], te["x"], te["y"]
    perm = np.random.default_rng(20261125).permutation(len(ytr))
    test = np.sort(np.random.default_rng(20261126).permutation(len(yte))[:2000])
    for name, idx in (("cifar10", np.sort(perm[:11000])), ("cifar10_public", np.sort(perm[11000:13000]))):
        save(DATA / name, "train", xtr[idx], ytr[idx])
        t = test if name == "cifar10" else test[:10]  # the public set's test split is never read
        save(DATA / name, "test", xte[t], yte[t])
        shutil.copy(shared / "cifar10/classes.txt", DATA / name / "classes.txt")
    for split, (x, y) in _food_slice(shared).items():
        save(DATA / "food101", split, x, y)
    shutil.copy(shared / "food101/classes.txt", DATA / "food101/classes.txt")
    print(f"wrote {DATA}: {sum(p.stat().st_size for p in DATA.rglob('*') if p.is_file()) / 2**20:.1f} MiB")


def _food_slice(shared: Path) -> dict:
    """The Food-101 images the GPU scales carry for the Ke et al. arm: 3,000 training and 600 test images, seeded
    draws of the shared arrays. ``{split: (x, y)}``."""
    import numpy as np

    with np.load(shared / "food101/train.npz") as tr, np.load(shared / "food101/test.npz") as te:
        i = np.sort(np.random.default_rng(1).permutation(len(tr["y"]))[:3000])
        j = np.sort(np.random.default_rng(2).permutation(len(te["y"]))[:600])
        return {"train": (tr["x"][i], tr["y"][i]), "test": (te["x"][j], te["y"][j])}


def _jpeg(x, quality: int) -> tuple:
    """Images as one JPEG byte string and its offsets."""
    import io

    import numpy as np
    from PIL import Image

    blobs = []
    for im in x:
        buf = io.BytesIO()
        Image.fromarray(im).save(buf, format="JPEG", quality=quality)
        blobs.append(buf.getvalue())
    return np.frombuffer(b"".join(blobs), dtype=np.uint8), np.cumsum([0] + [len(b) for b in blobs]).astype(np.int64)


def pack_jpeg(shared: Path, dest: Path, quality: int = 75) -> None:
    """All of CIFAR-10 (45,000 + 10,000 images) as JPEG bytes in one npz (``<split>_jpeg``, ``<split>_offsets``,
    ``<split>_y``), and the Food-101 slice of :func:`_food_slice` (the Ke et al. arm's task) under ``food101_``
    keys: about 52 MiB, so both fit the GPU machine's 64 MiB upload. The shared arrays are themselves decoded JPEGs
    of quality 75, so re-encoding at 75 is nearly idempotent (measured on 2,000 images: mean absolute difference
    0.16/255, 923 bytes per image); :func:`unpack_jpeg` decodes on the device."""
    import numpy as np

    arrays = {}
    for split in ("train", "test"):
        with np.load(shared / f"cifar10/{split}.npz") as d:
            x, y = d["x"], d["y"]
        arrays[f"{split}_jpeg"], arrays[f"{split}_offsets"] = _jpeg(x, quality)
        arrays[f"{split}_y"] = y
    arrays["classes"] = np.array((shared / "cifar10/classes.txt").read_text().split("\n")[:10])
    if (shared / "food101").is_dir():
        for split, (x, y) in _food_slice(shared).items():
            arrays[f"food101_{split}_jpeg"], arrays[f"food101_{split}_offsets"] = _jpeg(x, quality)
            arrays[f"food101_{split}_y"] = y
        arrays["food101_classes"] = np.array([c for c in (shared / "food101/classes.txt").read_text().split("\n")
                                              if c])
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez(dest, **arrays)
    print(f"wrote {dest}: {dest.stat().st_size / 2**20:.1f} MiB")


def unpack_jpeg(src: Path, folder: Path) -> None:
    """Decode a :func:`pack_jpeg` file into ``folder/{train,test}.npz`` (the npz layout every loader reads) and,
    when the pack holds it, the Food-101 slice into ``food101/`` beside ``folder``."""
    import io

    import numpy as np
    from PIL import Image

    with np.load(src, allow_pickle=False) as d:
        for prefix, out in (("", folder), ("food101_", folder.parent / "food101")):
            if f"{prefix}train_jpeg" not in d:
                continue
            out.mkdir(parents=True, exist_ok=True)
            for split in ("train", "test"):
                raw, off = d[f"{prefix}{split}_jpeg"].tobytes(), d[f"{prefix}{split}_offsets"]
                x = np.stack([np.asarray(Image.open(io.BytesIO(raw[a:b])).convert("RGB"))
                              for a, b in zip(off[:-1], off[1:])])
                np.savez(out / f"{split}.npz", x=x, y=d[f"{prefix}{split}_y"])
            (out / "classes.txt").write_text("\n".join(str(c) for c in d[f"{prefix}classes"]) + "\n")
            print(f"decoded {src} into {out}")
