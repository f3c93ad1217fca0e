"""Data that streams (training/data/stream.py): the streamed path gives exactly the in-memory path's pool, batches,
weights, accuracy and signals, on tiny files in the real on-disk formats (iNat 2021 PNG folders, Places365 JPEGs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from attacks.signals import AugmentationSpec, compute_signals
from training.config import DataConfig, TrainConfig, apply_overrides
from training.data import ImageSet, RowArray, StreamSet, load_pool, load_test
from training.data.stream import MEMORY_BUDGET_BYTES, decide_stream
from training.dp.sampling import make_sampler
from foundation.errors import DataError
from training.evaluate import accuracy, mean_loss
from foundation.io import ArrayFingerprint, fingerprint_arrays, load_safetensors
from training.models import build_model
from training.pool import build_pool
from training.pool import membership_mask
from training.trainer import train

from fixtures_runs import TINY_TRAIN

INAT = ["00000_Animalia_Chordata_Aves_Passeriformes_Paridae_Parus_major",
        "00001_Plantae_Tracheophyta_Magnoliopsida_Rosales_Rosaceae_Rosa_canina",
        "00002_Fungi_Basidiomycota_Agaricomycetes_Agaricales_Amanitaceae_Amanita_muscaria"]


def make_inat(root: Path, *, per_class: int = 12, valid: int = 4, size: int = 10, seed: int = 0) -> Path:
    """iNat 2021 layout (2021_train_mini/ and 2021_valid/ category folders of PNGs), class-dependent pixels."""
    rng = np.random.default_rng(seed)
    for split, count in (("2021_train_mini", per_class), ("2021_valid", valid)):
        for c, name in enumerate(INAT):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(count):
                img = rng.integers(0, 120, (size, size, 3), dtype=np.uint8)
                img[..., c] += 120  # learnable: the class is the brightest channel
                Image.fromarray(img).save(folder / f"{k:03d}.png")
    return root


def make_places(root: Path, *, n: int = 30, seed: int = 1) -> Path:
    """Places365 layout: categories, file lists, JPEGs under data_256_standard/ and val_256/ (non-square)."""
    rng = np.random.default_rng(seed)
    cats = ["/a/airfield", "/b/bakery/shop", "/c/canyon"]
    root.mkdir(parents=True, exist_ok=True)
    (root / "categories_places365.txt").write_text("".join(f"{c} {i}\n" for i, c in enumerate(cats)))
    for listing, folder, count, wh in (("places365_train_standard.txt", "data_256_standard", n, (14, 12)),
                                       ("places365_val.txt", "val_256", 9, (12, 16))):
        lines = []
        for k in range(count):
            label = int(rng.integers(0, 3))
            rel = f"{cats[label]}/{k:08d}.jpg" if folder == "data_256_standard" else f"Places365_val_{k:08d}.jpg"
            path = root / folder / rel.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (wh[1], wh[0], 3), dtype=np.uint8)).save(path, quality=90)
            lines.append(f"{rel} {label}")
        (root / listing).write_text("\n".join(lines) + "\n")
    return root


def inat_cfg(root: Path, tmp: Path, **over) -> TrainConfig:
    base = {**TINY_TRAIN, "data": {"dataset": "inat2021", "root": str(root), "split": "train_mini",
                                   "test_split": "valid", "image_size": 8, "pool_size": 30, "pool_seed": 4}}
    return TrainConfig.model_validate(apply_overrides(base, {
        "output_dir": str(tmp), "training.steps": 6, "training.batch_size": 8, "training.physical_batch_size": 4,
        "training.eval_every": 3, **over}))


# ----------------------------------------------------------------------------------------- fingerprint


def test_chunked_fingerprint_equals_whole_array_fingerprint():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (7, 3, 2, 3), dtype=np.uint8)
    y = rng.integers(0, 5, 7).astype(np.int64)
    whole = fingerprint_arrays(x, y)
    for cuts in ([], [1], [3, 4], [0, 2, 2, 7]):
        fp = ArrayFingerprint()
        fp.begin(x.dtype, x.shape)
        for part in np.split(x, cuts):
            fp.update(part)
        fp.begin(y.dtype, y.shape)
        fp.update(y)
        assert fp.hexdigest() == whole
    fp = ArrayFingerprint()
    fp.begin(np.uint8, x.shape)
    fp.update(x[:3])
    with pytest.raises(ValueError, match="still lacks"):
        fp.hexdigest()
    with pytest.raises(ValueError, match="exceeds"):
        fp.update(x)
    with pytest.raises(TypeError, match="dtype"):
        fp.update(y)


# ----------------------------------------------------------------------------------------- pool semantics


def test_row_array_indexes_like_the_decoded_array(tmp_path):
    make_inat(tmp_path, per_class=4, valid=1)
    cfg = DataConfig(dataset="inat2021", root=str(tmp_path), split="train_mini", test_split=None)
    dense = load_pool(cfg.model_copy(update={"stream": False})).x
    rows = load_pool(cfg.model_copy(update={"stream": True})).x
    assert isinstance(rows, RowArray) and rows.shape == dense.shape and len(rows) == len(dense)
    mask = np.arange(len(dense)) % 3 == 1
    for key in (5, -1, slice(2, 9, 3), slice(None), [4, 0, 4], np.array([[1, 2], [11, 0]]), mask, []):
        np.testing.assert_array_equal(rows[key], dense[key])
    np.testing.assert_array_equal(np.asarray(rows), dense)
    extra = np.full((2, *dense.shape[1:]), 7, np.uint8)
    both = rows.appended(extra).subset([13, 0, 12])
    np.testing.assert_array_equal(both[:], np.concatenate([dense, extra])[[13, 0, 12]])
    with pytest.raises(IndexError):
        rows[len(dense)]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", ["inat2021", "places365"])
def test_streamed_pool_equals_in_memory_pool(tmp_path, fmt, workers):
    if fmt == "inat2021":
        make_inat(tmp_path)
        data = {"dataset": "inat2021", "split": "train_mini", "test_split": "valid", "image_size": 8}
    else:
        make_places(tmp_path)
        data = {"dataset": "places365", "split": "train", "test_split": "val", "image_size": 6}
    data = {**data, "root": str(tmp_path), "pool_size": 25, "pool_seed": 2, "workers": workers}
    for canaries in ({"count": 3, "kind": "mislabel"}, {"count": 2, "kind": "ood"}):
        pools = {}
        for stream in (False, True):
            cfg = TrainConfig.model_validate(apply_overrides(TINY_TRAIN, {
                "data": {**data, "stream": stream}, "training.canaries": canaries}))
            pools[stream] = (cfg, build_pool(cfg))
        (cfg_mem, mem), (cfg_str, st) = pools[False], pools[True]
        assert isinstance(mem.images, ImageSet) and isinstance(st.images, StreamSet) and st.streamed
        assert isinstance(st.test, StreamSet) and not mem.streamed
        assert st.n_real == mem.n_real == 25 and st.canaries == mem.canaries
        np.testing.assert_array_equal(np.asarray(st.images.x), mem.images.x)
        np.testing.assert_array_equal(st.images.y, mem.images.y)
        np.testing.assert_array_equal(np.asarray(st.test.x), mem.test.x)
        np.testing.assert_array_equal(st.test.y, mem.test.y)
        assert st.images.fingerprint() == mem.images.fingerprint() == fingerprint_arrays(mem.images.x, mem.images.y)
        assert st.test.fingerprint() == mem.test.fingerprint()
        for a, b in zip(membership_mask(cfg_str, st), membership_mask(cfg_mem, mem)):
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b


@pytest.mark.parametrize("workers", [0, 2])
def test_fingerprint_over_many_chunks_equals_in_memory(tmp_path, monkeypatch, workers):
    import training.data.stream as stream

    make_places(tmp_path, n=23)
    cfg = DataConfig(dataset="places365", root=str(tmp_path), split="train", test_split=None, image_size=5,
                     workers=workers)
    mem = load_pool(cfg.model_copy(update={"stream": False}))
    monkeypatch.setattr(stream, "CHUNK_ROWS", 4)  # 6 chunks, the last one short
    st = load_pool(cfg.model_copy(update={"stream": True}))
    assert [len(c) for _, c in st.x.chunks()] == [4, 4, 4, 4, 4, 3]
    assert st.fingerprint() == mem.fingerprint()
    canaries = np.full((2, 5, 5, 3), 9, np.uint8)
    both = st.appended(canaries, [0, 1])
    assert both.fingerprint() == fingerprint_arrays(np.concatenate([mem.x, canaries]),
                                                    np.concatenate([mem.y, [0, 1]]))
    assert both.fingerprint() != st.fingerprint()


def test_stream_decision_array_sets_and_budget(tmp_path, monkeypatch):
    x = np.random.default_rng(0).integers(0, 256, (20, 8, 8, 3), dtype=np.uint8)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(20) % 4)
    array_set = load_pool(DataConfig(dataset="npz", root=str(tmp_path / "d.npz"), test_split=None, stream=True))
    assert isinstance(array_set, ImageSet)  # array sets keep the in-memory path, whatever data.stream says
    assert decide_stream("auto", file_backed=True, nbytes=MEMORY_BUDGET_BYTES) is False
    assert decide_stream("auto", file_backed=True, nbytes=MEMORY_BUDGET_BYTES + 1) is True
    assert decide_stream("auto", file_backed=False, nbytes=10 * MEMORY_BUDGET_BYTES) is False
    assert decide_stream(False, file_backed=True, nbytes=10 * MEMORY_BUDGET_BYTES) is False
    make_inat(tmp_path / "inat", per_class=2, valid=1)
    small = load_pool(DataConfig(dataset="inat2021", root=str(tmp_path / "inat"), split="train_mini"))
    assert isinstance(small, ImageSet)  # auto: 6 tiny images fit the budget
    import training.data.stream as stream

    monkeypatch.setattr(stream, "MEMORY_BUDGET_BYTES", 6 * 32 * 32 * 3 - 1)  # one byte short of the pool
    large = load_pool(DataConfig(dataset="inat2021", root=str(tmp_path / "inat"), split="train_mini"))
    assert isinstance(large, StreamSet) and large.fingerprint() == small.fingerprint()
    with pytest.raises(ValueError, match="true, false or auto"):
        decide_stream("yes", file_backed=True, nbytes=1)


def test_loader_yields_exactly_the_samplers_batches(tmp_path):
    make_inat(tmp_path, per_class=6, valid=1)
    cfg = DataConfig(dataset="inat2021", root=str(tmp_path), split="train_mini", test_split=None, image_size=8)
    dense = load_pool(cfg.model_copy(update={"stream": False})).x
    sampler = make_sampler(sampling="poisson", n=len(dense), batch_size=3, seed=5)
    wanted = [sampler.indices(t) for t in range(12)]
    for workers in (0, 2):
        rows = load_pool(cfg.model_copy(update={"stream": True, "workers": workers})).x
        got = list(rows.loader(iter(wanted)))
        assert len(got) == len(wanted)
        for (xb, pos), idx in zip(got, wanted):
            assert pos.tolist() == idx.tolist() and xb.dtype == torch.uint8
            np.testing.assert_array_equal(xb.numpy(), dense[idx])


# ----------------------------------------------------------------------------------------- training and evaluation


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_safetensors(run_dir / "model.safetensors")


def _same_run(a, b) -> None:
    wa, wb = _weights(a.run_dir), _weights(b.run_dir)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0)
    assert a.manifest.data.pool_fingerprint == b.manifest.data.pool_fingerprint
    for key in ("test_accuracy", "train_accuracy"):
        assert a.metrics[key] == b.metrics[key]
    assert [h.get("loss") for h in a.metrics["history"]] == [h.get("loss") for h in b.metrics["history"]]


def test_training_streamed_equals_in_memory_and_resumes(tmp_path):
    root = make_inat(tmp_path / "data")
    # DP-SGD with Poisson sampling, in memory and streamed by 2 worker processes
    mem = train(inat_cfg(root, tmp_path / "mem", **{"data.stream": False}))
    streamed = train(inat_cfg(root, tmp_path / "w2", **{"data.stream": True, "data.workers": 2}))
    assert mem.manifest.data.streamed is False and streamed.manifest.data.streamed is True
    assert mem.manifest.privacy.phases[0].sampling == "poisson"
    _same_run(streamed, mem)
    # without DP (no accounting: fast; still Poisson batches): in-process decoding, a resume, input canaries
    plain = {"privacy.enabled": False, "privacy.noise_multiplier": None}
    ref = train(inat_cfg(root, tmp_path / "m0", **plain, **{"data.stream": False}))
    _same_run(train(inat_cfg(root, tmp_path / "w0", **plain, **{"data.stream": True, "data.workers": 0})), ref)
    cfg = inat_cfg(root, tmp_path / "resumed", **plain, **{"data.stream": True, "data.workers": 2})
    with pytest.raises(KeyboardInterrupt):
        train(cfg, stop_after=4)  # mid-phase: the resumed run's streamed batches 5 and 6 are the uninterrupted ones
    resumed = train(cfg, resume=True)
    assert resumed.resumed_from == 4
    _same_run(resumed, ref)
    canaries = {**plain, "training.canaries.count": 2, "training.canaries.kind": "mislabel", "data.workers": 2}
    with_canaries = train(inat_cfg(root, tmp_path / "c1", **canaries, **{"data.stream": True}))
    assert with_canaries.manifest.data.canaries["count"] == 2
    _same_run(with_canaries, train(inat_cfg(root, tmp_path / "c0", **canaries, **{"data.stream": False})))


def test_evaluation_and_signals_streamed_equal_in_memory(tmp_path):
    root = make_inat(tmp_path)
    cfg = DataConfig(dataset="inat2021", root=str(root), split="train_mini", test_split="valid", image_size=8)
    mem = load_pool(cfg.model_copy(update={"stream": False}))
    model = build_model(TrainConfig().model.model_copy(update={"arch": "small_cnn"}), num_classes=3,
                        input_shape=(3, 8, 8), seed=0).module
    spec = AugmentationSpec(flip=True, shifts=1)
    ref_phi = compute_signals(model, mem.x, mem.y, spec=spec, batch_size=7)
    for workers in (0, 2):
        st = load_pool(cfg.model_copy(update={"stream": True, "workers": workers}))
        test = load_test(cfg.model_copy(update={"workers": workers}), stream=True)
        assert isinstance(st, StreamSet) and isinstance(test, StreamSet)
        assert accuracy(model, st, device="cpu", batch_size=7) == accuracy(model, mem, device="cpu", batch_size=7)
        assert mean_loss(model, st, device="cpu", batch_size=5) == mean_loss(model, mem, device="cpu", batch_size=5)
        assert accuracy(model, test, device="cpu") == accuracy(model, test.materialize(), device="cpu")
        phi = compute_signals(model, st.x, st.y, spec=spec, batch_size=7)
        np.testing.assert_array_equal(phi, ref_phi)
        sub = st.subset(np.array([9, 1, 30]))
        np.testing.assert_array_equal(compute_signals(model, sub.x, sub.y, spec=spec), ref_phi[[9, 1, 30]])


# ----------------------------------------------------------------------------------------- bad files


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_file_mid_stream_is_one_line_naming_the_file(tmp_path, workers):
    root = make_inat(tmp_path)
    bad = root / "2021_train_mini" / INAT[1] / "005.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    cfg = DataConfig(dataset="inat2021", root=str(root), split="train_mini", test_split=None, stream=True,
                     workers=workers)
    pool = load_pool(cfg)  # listing only: nothing decoded yet
    with pytest.raises(DataError) as err:
        pool.fingerprint()
    message = str(err.value)
    assert "\n" not in message and str(bad) in message and "cannot decode image" in message
    with pytest.raises(DataError) as err:  # 9 batches: decoded by the worker processes when there are any
        accuracy(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(3)), pool, device="cpu", batch_size=4)
    assert str(err.value) == message


# ----------------------------------------------------------------------------------------- audit attack


def test_attack_on_a_streamed_run_equals_in_memory(tmp_path):
    from attacks.config import AttackConfig
    from attacks.recipe import shadow_recipe
    from attacks.runner import run_attack
    from attacks.shadow_train import resolve_executor
    from audit.reporting.provenance import provenance_section
    from audit.reporting.images import load_pool_images
    from audit.reporting.inputs import load_run
    from training.run import open_run

    root = make_inat(tmp_path / "data")
    plain = {"privacy.enabled": False, "privacy.noise_multiplier": None, "training.eval_every": 0}
    scores = {}
    for stream in (False, True):
        target = train(inat_cfg(root, tmp_path / str(stream), **plain, **{"data.stream": stream, "data.workers": 0}))
        config = AttackConfig(n_reference=4, n_bootstrap=10, population=6, evaluation="both", flip=True, shifts=0,
                              executor="sequential", device="cpu", attacks=("lira_online", "rmia_offline"))
        result = run_attack(run_dir=target.run_dir, config=config, progress=False)
        with np.load(target.run_dir / "signals.npz") as f:
            scores[stream] = {k: f[k] for k in f.files}
        shadows = sorted((target.run_dir / "shadows").glob("*/manifest.json"))
        assert len(shadows) == 4
        run = open_run(target.run_dir)
        recipe = shadow_recipe(config=run.config, manifest=run.manifest)
        chosen = resolve_executor("auto", recipe=recipe, num_classes=3, input_shape=(3, 8, 8), streamed=stream)
        assert chosen == ("sequential" if stream else "batched")  # auto never copies a streamed pool into memory
        files = load_run(target.run_dir)
        dataset = dict(provenance_section(files, {k: k for k in ("train", "attack", "epsilon", "transfer",
                                                                   "report")}).items)["dataset"]
        assert dataset.endswith("streamed from disk)") == stream
        images, _ = load_pool_images(files)
        assert isinstance(images.x, RowArray) == stream  # thumbnails of a streamed pool: only their rows decoded
        np.testing.assert_array_equal(images.x[[3, 1]], target.pool.images.x[[3, 1]])
        assert result is not None
    assert scores[True].keys() == scores[False].keys()
    # the key hashes the config (data.stream differs), and with it the content hash and the evidence signature
    for k in set(scores[False]) - {"key", "content_sha256", "evidence_mac"}:
        np.testing.assert_array_equal(scores[True][k], scores[False][k], err_msg=k)


def test_cli_train_with_a_corrupt_file_mid_stream(tmp_path):
    import yaml
    from click.testing import CliRunner

    from audit.cli import main

    root = make_inat(tmp_path / "data")
    (root / "2021_valid" / INAT[2] / "001.png").write_bytes(b"not a png")  # decoded only when evaluating
    cfg = inat_cfg(root, tmp_path / "runs", **{"data.stream": True, "data.workers": 2,
                                               "privacy.enabled": False, "privacy.noise_multiplier": None})
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    r = CliRunner().invoke(main, ["train", str(path), "--no-progress"])
    err = r.stderr.strip()
    assert r.exit_code == 2 and err.startswith("error:") and "\n" not in err and "Traceback" not in err, r.output
    assert "001.png" in err and "cannot decode image" in err
    assert not (cfg.run_dir() / "manifest.json").exists()
