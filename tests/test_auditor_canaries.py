"""Auditor-chosen canaries: commitment round trip, every mismatch refused, package semantics, LiRA on canaries.

The protocol is ``audit canaries make`` → the vendor trains on its data + the package → ``audit epsilon RUN
--canaries SECRET``. Runs here are tiny (synthetic 8×8 data, an MLP, a few steps).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from attacks.lira import fit_gaussians, gaussian_logpdf
from audit.canaries import make_canaries, read_secret, verify_secret, write_canaries
from audit.canaries.references import ReferenceSet
from audit.cli import main
from audit.config import EpsilonConfig
from audit.bounds.auditor_source import check_run_against_secret, lira_canary_scores, mixture_loglik
from audit.bounds.runner import SourcedEstimate, _estimate, judge_estimates
from audit.bounds.sources import Evidence
from training.canary_package import read_package
from training.config import TrainConfig
from foundation.errors import CheckpointError, DataError
from training.pool import build_pool
from training.run import open_run
from foundation.files import CANARY_PACKAGE_FILE
from training.trainer import train

SALT = "5a" * 32


def _secret(tmp_path: Path, *, count: int = 40, seed: int = 3, name: str = "c") -> tuple:
    secret = make_canaries(count=count, num_classes=4, image_size=(8, 8), seed=seed, salt=SALT)
    return secret, write_canaries(tmp_path / name, secret)


def _cfg(tmp_path: Path, package: Path, **training) -> TrainConfig:
    return TrainConfig.model_validate({
        "name": "vendor", "output_dir": str(tmp_path / "runs"),
        "data": {"dataset": "synthetic", "split": "train:n=60,classes=4", "test_split": "test:n=20,classes=4",
                 "audit_split": True, "member_prob": 0.5},
        "model": {"arch": "mlp", "kwargs": {"hidden": [32]}},
        "privacy": {"enabled": True, "noise_multiplier": 1.0, "delta": 1e-5},
        "optim": {"name": "sgd", "lr": 0.1},
        "training": {"steps": 3, "batch_size": 16, "progress": False, "canaries": {"from_file": str(package)},
                     **training}})


@pytest.fixture(scope="module")
def vendor_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vendor")
    secret, paths = _secret(tmp)
    result = train(_cfg(tmp, paths["package"]))
    return tmp, secret, paths, result.run_dir


def test_commitment_round_trip_and_the_package_hides_the_bits(tmp_path):
    secret, paths = _secret(tmp_path, count=200)
    back = read_secret(paths["secret"])
    assert back.commitment == secret.commitment == verify_secret(back) == paths["commitment"].read_text().strip()
    assert np.array_equal(back.included, secret.included) and back.seed == secret.seed
    pkg = read_package(paths["package"])
    assert pkg.commitment == secret.commitment and pkg.sha256 == back.package_sha256
    assert pkg.count == int(secret.included.sum()) < secret.count
    assert np.array_equal(pkg.x, secret.package_x) and np.array_equal(pkg.y, secret.package_y)
    assert np.array_equal(secret.package_x, secret.x[secret.package_order])
    # the package holds the included canaries only, shuffled, and nothing that names the bits, seed or salt
    with np.load(paths["package"], allow_pickle=False) as npz:
        assert set(npz.files) == {"x", "y", "meta"}
        meta = json.loads(str(npz["meta"][()]))
    assert not {"seed", "salt", "included", "package_order"} & set(meta)
    assert not np.array_equal(secret.package_order, np.sort(secret.package_order))
    # the same seed and salt give the same commitment; another salt hides it
    assert make_canaries(count=200, num_classes=4, image_size=(8, 8), seed=3, salt=SALT).commitment == secret.commitment
    assert make_canaries(count=200, num_classes=4, image_size=(8, 8), seed=3).commitment != secret.commitment


def _resave(path: Path, **changes) -> None:
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays.update(changes)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def test_a_tampered_secret_is_refused(tmp_path):
    secret, paths = _secret(tmp_path)
    flipped = secret.included.copy()
    flipped[[0, 1]] = ~flipped[[0, 1]]
    order = np.random.default_rng(0).permutation(np.flatnonzero(flipped)).astype(np.int64)
    _resave(paths["secret"], included=flipped, package_order=order)
    with pytest.raises(CheckpointError, match="altered after it was made"):
        read_secret(paths["secret"])


def test_the_run_records_the_package_and_every_canary_is_a_member(vendor_run):
    _, secret, paths, run_dir = vendor_run
    run = open_run(run_dir)
    c = run.manifest.data.canaries
    assert c["kind"] == "auditor" and c["commitment"] == secret.commitment
    assert c["package_sha256"] == read_package(paths["package"]).sha256 == secret_sha(paths)
    first = c["first_index"]
    assert run.membership[first:].all() and len(run.pool) == first + c["count"]
    assert 0 < run.membership[:first].sum() < first  # real examples: Bernoulli(1/2)
    assert check_run_against_secret(run, read_secret(paths["secret"])) == (first, c["count"])


def secret_sha(paths) -> str:
    return read_secret(paths["secret"]).package_sha256


def test_the_package_through_the_pool_builder_gives_the_same_fingerprint_twice(vendor_run, tmp_path):
    tmp, _, paths, run_dir = vendor_run
    cfg = _cfg(tmp, paths["package"])
    a, b = build_pool(cfg), build_pool(cfg, canary_package=run_dir / CANARY_PACKAGE_FILE)
    assert a.images.fingerprint() == b.images.fingerprint() == open_run(run_dir).manifest.data.pool_fingerprint
    assert a.n_canaries == read_package(paths["package"]).count and a.auditor_canaries
    other, other_paths = _secret(tmp_path, seed=4)
    assert build_pool(_cfg(tmp, other_paths["package"])).images.fingerprint() != a.images.fingerprint()


def test_every_mismatch_between_run_and_secret_is_refused(vendor_run, tmp_path):
    tmp, secret, paths, run_dir = vendor_run
    _, other = _secret(tmp_path, seed=9, name="other")  # another secret: its commitment is not the run's
    with pytest.raises(CheckpointError, match="commitment recorded in run"):
        check_run_against_secret(open_run(run_dir), read_secret(other["secret"]))
    # a run whose package copy was swapped: refused when the pool is rebuilt (sha256 in the manifest)
    swapped = tmp_path / "swapped"
    import shutil

    shutil.copytree(run_dir, swapped)
    shutil.copyfile(other["package"], swapped / CANARY_PACKAGE_FILE)
    with pytest.raises(CheckpointError, match="does not match the package sha256"):
        check_run_against_secret(open_run(swapped, verify=False), read_secret(paths["secret"]))
    # a run trained without any auditor package
    plain = train(_cfg(tmp_path, paths["package"]).model_copy(update={
        "name": "plain", "training": _cfg(tmp_path, paths["package"]).training.model_copy(
            update={"canaries": _cfg(tmp_path, paths["package"]).training.canaries.model_copy(
                update={"from_file": None})})}))
    with pytest.raises(CheckpointError, match="did not train on an auditor's canary package"):
        check_run_against_secret(open_run(plain.run_dir), read_secret(paths["secret"]))
    # a vendor that edits the package (relabels a canary) and trains on it: not the file the secret wrote
    import shutil as _sh

    forged = tmp_path / "forged_package.npz"
    _sh.copyfile(paths["package"], forged)
    pkg = read_package(forged)
    _resave(forged, y=np.where(np.arange(pkg.count) == 0, (pkg.y + 1) % 4, pkg.y))
    edited = _cfg(tmp_path, forged)
    edited = train(edited.model_copy(update={"name": "edited"})).run_dir
    with pytest.raises(CheckpointError, match="is not the file this secret wrote"):
        check_run_against_secret(open_run(edited), read_secret(paths["secret"]))
    # the CLI: one line, exit 2, before any reference model is trained
    res = CliRunner().invoke(main, ["epsilon", str(run_dir), "--canaries", str(other["secret"])])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and res.output.startswith("error: ")
    assert not (run_dir / "canary_references").exists()


def test_a_bad_package_is_a_one_line_error(tmp_path):
    secret, paths = _secret(tmp_path)
    _resave(paths["package"], y=np.full(int(secret.included.sum()), 7, dtype=np.int64))
    with pytest.raises(DataError, match="labels must lie in"):
        read_package(paths["package"], num_classes=4)
    (tmp_path / "pickled.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable .npz"):
        read_package(tmp_path / "pickled.npz")
    with pytest.raises(ValueError, match="count .* or from_file, not both"):
        TrainConfig.model_validate({"training": {"steps": 1, "canaries": {"count": 3, "from_file": "x.npz"}}})


def _refs(rng, k: int = 8, m: int = 30, shift: float = 2.0) -> ReferenceSet:
    keep = np.zeros((k, m), dtype=bool)
    for i in range(m):
        keep[rng.permutation(k)[: k // 2], i] = True
    phi = rng.normal(size=(k, m, 1)) + shift * keep[..., None] + rng.normal(size=(1, m, 1))
    return ReferenceSet(name="t", noise_multiplier=0.0, keep=keep, phi=phi, root=Path("."), key="k", trained=0)


def test_lira_on_canaries_equals_a_naive_per_canary_loop():
    rng = np.random.default_rng(0)
    refs = _refs(rng)
    target = rng.normal(size=(30, 1)) + 1.0
    got = lira_canary_scores(target, refs)
    ins = [refs.phi[refs.keep[:, i], i, 0] for i in range(30)]
    outs = [refs.phi[~refs.keep[:, i], i, 0] for i in range(30)]
    pooled = [sum(((v - v.mean()) ** 2).sum() for v in side) / sum(len(v) - 1 for v in side) for side in (ins, outs)]
    want, mix = [], 0.0
    for i in range(30):
        t = float(target[i, 0])
        li = -0.5 * (np.log(2 * np.pi * pooled[0]) + (t - ins[i].mean()) ** 2 / pooled[0])
        lo = -0.5 * (np.log(2 * np.pi * pooled[1]) + (t - outs[i].mean()) ** 2 / pooled[1])
        want.append(li - lo)
        mix += np.log(0.5 * np.exp(li) + 0.5 * np.exp(lo))
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert mixture_loglik(target, refs) == pytest.approx(mix, rel=1e-10)
    # the mixture prefers the set the target was drawn like
    same = _refs(np.random.default_rng(1), shift=2.0)
    flat = ReferenceSet(**{**same.__dict__, "phi": same.phi - 2.0 * same.keep[..., None]})
    members = np.random.default_rng(2).random(30) < 0.5
    drawn = (np.random.default_rng(3).normal(size=30) + 2.0 * members)[:, None]
    assert mixture_loglik(drawn, same) > mixture_loglik(drawn, flat)
    fit = fit_gaussians(same.phi, same.keep, fix_variance=True)
    assert np.isfinite(gaussian_logpdf(drawn, fit.mu, fit.var)).all()


def test_null_canary_scores_give_no_violation():
    config = EpsilonConfig()
    violations = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        included = rng.random(1000) < 0.5
        ev = Evidence(source="auditor_canaries", scores=rng.normal(size=1000), included=included, black_box=True)
        est = _estimate("one_run", ev, delta=1e-5, alpha=0.05, config=config)
        v = judge_estimates(claimed_epsilon=0.25, delta=1e-5,
                            estimates=[SourcedEstimate(source="auditor_canaries", estimate=est, in_verdict=True)])
        violations += str(v.status) == "VIOLATION"
    assert violations <= 2


def test_a_memoriser_claiming_small_epsilon_is_a_violation_from_black_box_evidence(tmp_path):
    """A model trained without the noise it claims (σ = 8 → ε ≈ 0.5) memorises the OOD canaries; the auditor's
    σ = 0 references explain it better than the claimed ones and the one-run bound exceeds the claim."""
    secret, paths = _secret(tmp_path, count=300)
    base = _cfg(tmp_path, paths["package"], steps=60, batch_size=32)
    cfg = base.model_copy(update={"model": base.model.model_copy(update={"kwargs": {"hidden": [256]}}),
                                  "optim": base.optim.model_copy(update={"name": "adam", "lr": 0.01}),
                                  "privacy": base.privacy.model_copy(update={"noise_multiplier": 8.0})})
    run_dir = train(cfg, _debug_disable_noise=True).run_dir
    from audit.bounds.runner import run_epsilon

    report = run_epsilon(run_dir=run_dir, config=EpsilonConfig(sources=("auditor_canaries",),
                                                               canaries=str(paths["secret"]), canary_references=4))
    claim = report.claimed_epsilon
    assert claim < 1.0 and report.verdict.findings == ()  # the forged record itself is consistent
    assert str(report.verdict.status) == "VIOLATION" and report.verdict.best_epsilon_lb > claim
    prov = report.estimates[0].provenance
    assert prov["reference_set_used"] == "sigma0" and prov["commitment"] == secret.commitment
    assert [s["name"] for s in prov["reference_sets"]] == ["claimed", "sigma0"]


def test_a_symlinked_canary_references_dir_shipped_with_the_run_is_never_written_through(vendor_run, tmp_path):
    """Issue 37: a `canary_references` folder received as a symbolic link to a path the vendor chose (holding a
    planted reference set) is removed, never followed: the auditor trains its own references inside the run
    directory and the vendor's target is left byte for byte as it was."""
    import shutil

    from audit.bounds.runner import run_epsilon
    from foundation.files import CANARY_REFERENCE_DIR

    _, _, paths, run_dir = vendor_run
    run = tmp_path / "received"
    shutil.copytree(run_dir, run)
    target = tmp_path / "vendor_chosen"
    (target / "claimed-planted").mkdir(parents=True)
    (target / "claimed-planted" / "index.json").write_text("{}")
    before = sorted((p.relative_to(target).as_posix(), p.read_bytes() if p.is_file() else b"")
                    for p in target.rglob("*"))
    (run / CANARY_REFERENCE_DIR).symlink_to(target, target_is_directory=True)
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("auditor_canaries",),
                                                           canaries=str(paths["secret"]), canary_references=2))
    refs = run / CANARY_REFERENCE_DIR
    assert not refs.is_symlink() and refs.is_dir()
    made = sorted(p.name for p in refs.iterdir())
    assert made and all(name.startswith(("claimed-", "sigma0-")) and name != "claimed-planted" for name in made)
    assert all((refs / name / "index.json").is_file() for name in made)
    assert sorted((p.relative_to(target).as_posix(), p.read_bytes() if p.is_file() else b"")
                  for p in target.rglob("*")) == before  # nothing written there
    prov = report.estimates[0].provenance
    assert all(s["trained_now"] == 2 for s in prov["reference_sets"])  # trained afresh, nothing of the vendor's reused


def test_a_symlinked_reference_set_inside_canary_references_is_replaced_not_written_through(vendor_run, tmp_path):
    """The same one level down: the auditor's own `canary_references/` holds a set folder swapped for a link to
    a vendor path. The set is re-trained into a real folder; the link's target is untouched."""
    import shutil

    from audit.bounds.runner import run_epsilon
    from foundation.files import CANARY_REFERENCE_DIR

    _, _, paths, run_dir = vendor_run
    run = tmp_path / "received"
    shutil.copytree(run_dir, run)
    cfg = EpsilonConfig(sources=("auditor_canaries",), canaries=str(paths["secret"]), canary_references=2,
                        canary_sigma0=False)
    run_epsilon(run_dir=run, config=cfg)
    refs = run / CANARY_REFERENCE_DIR
    (name,) = [p.name for p in refs.iterdir() if p.is_dir()]
    target = tmp_path / "vendor_chosen"
    shutil.copytree(refs / name, target)  # a plausible, valid-looking set at the vendor's path
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    shutil.rmtree(refs / name)
    (refs / name).symlink_to(target, target_is_directory=True)
    report = run_epsilon(run_dir=run, config=cfg)
    assert not (refs / name).is_symlink() and (refs / name / "index.json").is_file()
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert report.estimates[0].provenance["reference_sets"][0]["trained_now"] == 2  # not loaded through the link
