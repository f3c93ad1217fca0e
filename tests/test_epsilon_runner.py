"""Tests for `audit epsilon`: evidence sources, the runner's epsilon.json and verdict, and the CLI.

Run directories are built here from the manifest schema (no training): a pool whose members are drawn
Bernoulli(1/2), a ``scores.npz`` as `audit attack` writes it, and, for the white-box source, a tiny MLP whose final
weights are its initial weights moved against known canary directions.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from audit.config import EpsilonConfig
from audit.bounds.epsilon_file import EPSILON_FORMAT
from audit.bounds.runner import claim_is_gaussian, epsilon_is_complete, k_grids, run_epsilon
from audit.bounds.sources import (Evidence, Skipped, finite_scores, gradient_canary_evidence, input_canary_evidence,
                                   pool_evidence)
from training.config import TrainConfig, dump_config
from training.accounting import noise_multiplier_for
from foundation.errors import CheckpointError, ConfigError, DataError, UserError
from foundation.io import (fingerprint_arrays, save_safetensors, sha256_bytes, sha256_file, write_npy, write_npz,
                         write_text)
from fixtures_runs import write_signed
from training.pool import draw_membership
from training.run import inputs_digest, open_run
from training.run.manifest import (DataInfo, Manifest, MembershipInfo, ModelInfo, PhaseInfo, PrivacyInfo, Provenance,
                                   read_manifest, write_manifest)

TOP_KEYS = ["format", "run", "inputs", "claimed_epsilon", "delta", "alpha", "estimates", "skipped", "verdict", "code",
            "evidence"]
ESTIMATE_KEYS = ["method", "source", "epsilon_lb", "alpha", "delta", "counts", "ceiling", "assumptions", "extra"]
VERDICT_KEYS = ["status", "claimed_epsilon", "claimed_delta", "best_epsilon_lb", "best_method", "best_source",
                "tightness", "inconclusive_above", "confidence", "max_ceiling", "violating", "notes", "findings"]


def make_run(run_dir: Path, *, pool: int = 600, epsilon: float | None = 1.0, delta: float = 1e-5, p: float = 0.5,
             scheme: str = "bernoulli", sample_rate: float = 0.1, canaries: int = 0, seed: int = 0,
             weights: dict | None = None, config: TrainConfig | None = None, model: ModelInfo | None = None,
             fingerprint: str | None = None, training: dict | None = None) -> Path:
    """A schema-valid run directory (weights are a placeholder file unless ``weights`` is given)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    membership = rng.random(pool) < p if scheme == "bernoulli" else np.ones(pool, dtype=bool)
    drawn = scheme == "bernoulli" and 0 < p < 1
    if drawn:  # the draw the manifest records, canaries included (the reader draws it again)
        membership = draw_membership(pool, p=p, seed=seed)
    if canaries:
        inclusion = rng.random(canaries) < 0.5
        if not drawn:
            membership[pool - canaries:] = inclusion
    write_npy(run_dir / "membership.npy", membership)
    if weights is None:
        write_text(run_dir / "model.safetensors", "placeholder weights")
    else:
        save_safetensors(run_dir / "model.safetensors", weights)
    config_sha = None
    if config is not None:
        text = dump_config(config)
        write_text(run_dir / "config.yaml", text)
        config_sha = sha256_bytes(text.encode("utf-8"))
    dp = epsilon is not None
    steps = 100 if epsilon != 0 else 0  # ε = 0 follows only from no step at all
    sigma = (noise_multiplier_for(target_epsilon=epsilon, sample_rate=sample_rate, steps=steps, delta=delta,
                                  accountant="rdp") if steps else 1.0) if dp else None  # the claim follows
    phase = PhaseInfo(name="private" if dp else "non-private", dp=dp, noise_multiplier=sigma,
                      sample_rate=sample_rate, steps=steps, epsilon=epsilon)
    x = np.zeros((pool, 8, 8, 3), dtype=np.uint8)
    model = model or ModelInfo(arch="mlp", num_classes=10, input_shape=(3, 8, 8), param_count=1,
                               trainable_param_count=1, weights_sha256="")
    manifest = Manifest(
        run_name=run_dir.name,
        model=model.model_copy(update={"weights_sha256": sha256_file(run_dir / "model.safetensors")}),
        data=DataInfo(dataset=config.data.dataset if config is not None else "synthetic",
                      split=config.data.split if config is not None else "train", pool_size=pool,
                      pool_fingerprint=fingerprint or fingerprint_arrays(x, np.zeros(pool, dtype=np.int64)),
                      membership_sha256=sha256_file(run_dir / "membership.npy"),
                      membership=MembershipInfo(scheme=scheme, p=p if scheme == "bernoulli" else None, seed=seed,
                                                n_members=int(membership.sum()), n_pool=pool),
                      canaries={"kind": "ood", "count": canaries, "seed": 0, "first_index": pool - canaries}
                      if canaries else None),
        privacy=PrivacyInfo(dp=dp, delta=delta if dp else None, accountant="rdp" if dp else None, epsilon=epsilon,
                            phases=[phase]),
        training=training or {},
        provenance=Provenance(package_version="0", seed=seed, config_sha256=config_sha,
                              created="2025-01-01T00:00:00+00:00"),
    )
    write_manifest(run_dir, manifest)
    return run_dir


def write_scores(run_dir: Path, *, signal: float, seed: int = 1, attacks=("lira_online", "loss"),
                 index: np.ndarray | None = None, flip_membership: bool = False) -> np.ndarray:
    """scores.npz over ``index`` (default: the whole pool): members shifted up by ``signal`` standard deviations."""
    membership = np.load(run_dir / "membership.npy")
    index = np.arange(membership.size) if index is None else index
    mem = membership[index]
    rng = np.random.default_rng(seed)
    arrays = {f"score_{a}": rng.normal(size=index.size) + signal * mem for a in attacks}
    recorded = ~mem if flip_membership else mem
    write_signed(run_dir, "scores.npz", pool_index=index, membership=recorded, labels=np.zeros(index.size),
                 inputs_digest=np.array(identity_digest(run_dir)), **arrays)
    return mem


def identity_digest(run_dir: Path) -> str:
    """What ``audit attack`` records in ``scores.npz``: the run's identity digest."""
    return inputs_digest(open_run(run_dir, verify=False))


def read(run_dir: Path) -> dict:
    return json.loads((run_dir / "epsilon.json").read_text())


# ----------------------------------------------------------------------------------------------- pool source


def test_strong_pool_attack_gives_violation_with_exact_schema(tmp_path):
    run = make_run(tmp_path / "r", epsilon=1.0)
    write_scores(run, signal=6.0)
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    data = read(run)
    assert list(data) == TOP_KEYS
    assert data["format"] == EPSILON_FORMAT and data["run"] == "r"
    assert list(data["verdict"]) == VERDICT_KEYS
    assert set(data["inputs"]) == {"weights_sha256", "membership_sha256", "pool_fingerprint", "scores_sha256",
                                   "config_sha256", "claim_sha256"}
    assert data["inputs"]["scores_sha256"] == sha256_file(run / "scores.npz")
    assert [list(e) for e in data["estimates"]] == [ESTIMATE_KEYS] * len(data["estimates"])
    assert [(e["method"], e["source"]) for e in data["estimates"]] == [
        ("one_run", "pool"), ("one_run_fdp", "pool"), ("clopper_pearson", "pool"), ("gdp", "pool")]
    assert {"status", "best_epsilon_lb", "best_method", "tightness", "inconclusive_above", "notes"} <= set(
        data["verdict"])
    v = data["verdict"]
    assert v["status"] == "VIOLATION" and report.verdict.status == "VIOLATION"
    # q < 1: only the assumption-free one-run bound decides, at the full alpha
    deciding = [e for e in data["estimates"] if e["extra"]["in_verdict"]]
    assert [e["method"] for e in deciding] == ["one_run"]
    assert deciding[0]["alpha"] == 0.05 and deciding[0]["delta"] == 1e-5
    assert v["best_method"] == "one_run" and v["best_source"] == "pool"
    assert v["best_epsilon_lb"] == pytest.approx(deciding[0]["epsilon_lb"])
    assert v["best_epsilon_lb"] > 1.0
    assert v["tightness"] == pytest.approx(v["best_epsilon_lb"] / 1.0)
    assert deciding[0]["counts"]["m"] == 600 and deciding[0]["counts"]["v"] <= deciding[0]["counts"]["r"]
    assert deciding[0]["ceiling"] >= deciding[0]["epsilon_lb"]
    cp = data["estimates"][2]
    assert "independent trials" in cp["assumptions"] and cp["extra"]["threshold_strategy"] == "held_out"
    assert any(n.startswith("not in the verdict: pool/clopper_pearson") for n in v["notes"])


def test_null_scores_rarely_violate_even_a_zero_claim(tmp_path):
    """No signal: the deciding bound is 0 in at least 1 - alpha of seeded trials (claim 0: any bound > 0 violates)."""
    violations, bounds = 0, []
    for seed in range(20):
        run = make_run(tmp_path / f"r{seed}", epsilon=0.0, pool=400, seed=seed)
        write_scores(run, signal=0.0, seed=100 + seed)
        report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",), fdp=False), write=False)
        violations += report.verdict.status == "VIOLATION"
        bounds.append(report.verdict.best_epsilon_lb)
    assert violations <= 3  # Binomial(20, 0.05) exceeds 3 with probability 0.016
    assert np.median(bounds) == 0.0


def test_gaussian_claim_brings_fdp_into_the_verdict_and_splits_alpha(tmp_path):
    run = make_run(tmp_path / "r", epsilon=8.0, sample_rate=1.0)
    assert claim_is_gaussian(read_manifest(run))
    write_scores(run, signal=0.5)
    data = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",), alpha=0.1)).to_file().model_dump()
    deciding = {e["method"]: e["alpha"] for e in data["estimates"] if e["extra"]["in_verdict"]}
    assert deciding == {"one_run": pytest.approx(0.05), "one_run_fdp": pytest.approx(0.05)}
    assert data["verdict"]["status"] == "CONSISTENT"
    unsplit = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",), split_alpha=False,
                                                            gaussian_in_verdict="never"), write=False)
    assert [(e.estimate.method, e.estimate.alpha) for e in unsplit.estimates if e.in_verdict] == [("one_run", 0.05)]


def test_pool_source_needs_scores_and_the_configured_attack(tmp_path):
    run = make_run(tmp_path / "r")
    with pytest.raises(UserError, match="audit attack"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    write_scores(run, signal=1.0, attacks=("loss",))
    with pytest.raises(UserError, match="no scores for attack 'lira_online'.*loss"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",), attack="lira_online"))
    assert run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",), attack="loss"), write=False).estimates
    assert not (run / "epsilon.json").exists()


def test_default_attack_is_the_strongest_the_scores_hold(tmp_path):
    """No --attack: the first of rmia_online, lira_online, ..., loss that scores.npz holds (a fixed order)."""
    run = make_run(tmp_path / "r")
    write_scores(run, signal=1.0, attacks=("loss", "attack_p"))
    rep = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)), write=False)
    assert {e.provenance["attack"] for e in rep.estimates} == {"attack_p"}
    write_scores(run, signal=1.0, attacks=("loss", "lira_online", "rmia_online"))
    rep = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)), write=False)
    assert {e.provenance["attack"] for e in rep.estimates} == {"rmia_online"}


def test_scores_of_another_run_and_nan_scores_are_refused(tmp_path):
    run = make_run(tmp_path / "r")
    write_scores(run, signal=1.0, flip_membership=True)
    with pytest.raises(CheckpointError, match="differs from the run's membership"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    mem = np.load(run / "membership.npy")
    scores = np.where(mem, 1.0, 0.0)
    scores[3] = np.nan
    write_signed(run, "scores.npz", pool_index=np.arange(mem.size), membership=mem, score_lira_online=scores,
                 inputs_digest=np.array(identity_digest(run)))
    with pytest.raises(DataError, match="NaN"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    write_text(run / "scores.npz", "not an npz")
    with pytest.raises(CheckpointError, match="not a readable .npz"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))


def test_infinite_scores_keep_their_order():
    s = finite_scores(np.array([np.inf, 0.0, -np.inf, 3.0, np.inf]), what="t")
    assert np.all(np.isfinite(s)) and np.argsort(s, kind="stable").tolist() == [2, 1, 3, 0, 4]


def test_pool_is_skipped_unless_members_were_drawn_with_half_probability(tmp_path):
    run = make_run(tmp_path / "p3", p=0.3)
    write_scores(run, signal=3.0)
    ev = pool_evidence(run=open_run(run, verify=False), attack="lira_online")
    assert isinstance(ev, Skipped) and "p = 0.5" in ev.reason
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool", "input_canaries")))
    assert [s.source for s in report.skipped] == ["pool", "input_canaries"]
    assert report.estimates == () and report.verdict.status == "CONSISTENT"
    assert report.verdict.inconclusive_above == 0.0 and report.verdict.notes[0].startswith("no evidence")
    assert read(run)["skipped"][1] == {"source": "input_canaries",
                                       "reason": "the run has no input canaries (training.canaries.count = 0)"}


def test_tampered_weights_are_refused(tmp_path):
    run = make_run(tmp_path / "r")
    write_scores(run, signal=1.0)
    write_text(run / "model.safetensors", "other weights")
    with pytest.raises(CheckpointError, match="does not match the manifest"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))


def test_non_dp_run_gets_no_claim_and_a_default_delta(tmp_path):
    run = make_run(tmp_path / "r", epsilon=None, pool=400)
    write_scores(run, signal=4.0)
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    data = read(run)
    assert data["claimed_epsilon"] == "inf" and data["verdict"]["status"] == "NO_CLAIM"
    n = int(np.load(run / "membership.npy").sum())
    assert report.delta == pytest.approx(1e-4 if n <= 1000 else 1e-5)
    assert data["verdict"]["tightness"] is None and report.verdict.best_epsilon_lb > 1.0
    assert any("no δ" in note for note in data["verdict"]["notes"])


# ------------------------------------------------------------------------------------------- input canaries


def test_input_canaries_come_from_scores_npz_and_leave_the_pool(tmp_path):
    run = make_run(tmp_path / "r", pool=500, canaries=100, scheme="all")
    write_scores(run, signal=5.0)
    opened = open_run(run, verify=False)
    mem = opened.membership
    ev = input_canary_evidence(run=opened, attack="lira_online")
    assert isinstance(ev, Evidence) and ev.m == 100 and ev.black_box
    assert np.array_equal(ev.included, mem[400:]) and ev.provenance["first_index"] == 400
    # scheme 'all': the real pool is all members, so the pool source does not apply
    assert isinstance(pool_evidence(run=opened, attack="lira_online"), Skipped)
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool", "input_canaries")))
    assert [e.source for e in report.estimates] == ["input_canaries", "input_canaries"]
    assert report.verdict.status == "VIOLATION"


def test_input_canaries_without_scores_use_the_target_models_scaled_logit(tmp_path):
    from attacks.signals import compute_signals
    from training.models import build_model
    from training.pool import build_pool

    cfg = TrainConfig.model_validate({"name": "ic", "data": {"dataset": "digits", "pool_size": 40},
                                      "model": {"arch": "mlp", "kwargs": {"hidden": [8]}},
                                      "training": {"steps": 1, "canaries": {"count": 24, "kind": "ood"}}})
    pool = build_pool(cfg)
    torch.manual_seed(0)
    net = build_model(cfg.model, num_classes=10, input_shape=(3, 8, 8)).module.eval()
    info = ModelInfo(arch="mlp", kwargs={"hidden": [8]}, num_classes=10, input_shape=(3, 8, 8), param_count=1,
                     trainable_param_count=1, weights_sha256="")
    run = make_run(tmp_path / "ic", pool=64, canaries=24, scheme="all", weights=net.state_dict(), config=cfg,
                   model=info, fingerprint=pool.images.fingerprint())
    ev = input_canary_evidence(run=open_run(run, verify=False), attack="lira_online")
    expected = compute_signals(net, pool.images.x[40:].copy(), pool.images.y[40:].copy())[:, 0]
    assert ev.m == 24 and np.allclose(ev.scores, expected, atol=1e-6) and ev.provenance["attack"] == "loss"
    other = make_run(tmp_path / "other", pool=64, canaries=24, scheme="all", weights=net.state_dict(), config=cfg,
                     model=info)
    with pytest.raises(CheckpointError, match="fingerprint"):
        input_canary_evidence(run=open_run(other, verify=False), attack="lira_online")


def test_pool_source_excludes_input_canaries(tmp_path):
    run = make_run(tmp_path / "r", pool=500, canaries=100)
    write_scores(run, signal=1.0)
    ev = pool_evidence(run=open_run(run, verify=False), attack="lira_online")
    assert ev.m == 400


# ------------------------------------------------------------------------------------------ gradient canaries


def _white_box_run(tmp_path: Path, *, signal: float, count: int = 300, noise: float = 1.0) -> Path:
    """A run whose final weights are θ_0 moved against the included canaries' directions (plus noise), with the
    manifest's gradient-canary record written as the trainer writes it. The head is 'frozen': not in the record."""
    from training.dp.canaries import GradientCanaries, trainable_shapes
    from training.models import build_model
    from training.pool import draw_membership

    cfg = TrainConfig.model_validate({"name": "wb", "model": {"arch": "mlp", "kwargs": {"hidden": [64]}},
                                      "privacy": {"target_epsilon": 1.0, "accountant": "rdp"},
                                      "training": {"steps": 100, "batch_size": 60}})  # as make_run's claim says
    torch.manual_seed(0)
    net = build_model(cfg.model, num_classes=10, input_shape=(3, 8, 8)).module
    init = {k: v.clone() for k, v in net.state_dict().items()}
    shapes = {k: v for k, v in trainable_shapes(net).items() if ".head." not in k}
    canaries = GradientCanaries(param_shapes=shapes, count=count, seed=3, included=draw_membership(count, p=0.5, seed=3))
    assert canaries.dim > 10 * count  # near-orthogonal directions
    step = sum(canaries.direction(i).astype(np.float64) for i in np.flatnonzero(canaries.included))
    rng = np.random.default_rng(0)
    move = -signal * step + noise * rng.normal(size=canaries.dim)  # descent: against the added gradient
    final, offset = {k: v.clone() for k, v in init.items()}, 0
    for name in shapes:
        size = init[name].numel()
        final[name] = init[name] + torch.from_numpy(move[offset:offset + size]).float().view_as(init[name])
        offset += size
    run = tmp_path / "wb"
    run.mkdir()
    init_file = save_safetensors(run / "model_init.safetensors", init)
    inc_file = write_npy(run / "gradient_canaries.npy", canaries.included)
    record = {"count": count, "seed": 3, "included_file": inc_file.name, "included_sha256": sha256_file(inc_file),
              "n_included": int(canaries.included.sum()), "sample_rate": 1.0, "steps": 1,
              "param_names": list(shapes), "init_weights": init_file.name,
              "init_weights_sha256": sha256_file(init_file)}
    info = ModelInfo(arch="mlp", kwargs={"hidden": [64]}, num_classes=10, input_shape=(3, 8, 8), param_count=1,
                     trainable_param_count=1, weights_sha256="")
    return make_run(run, epsilon=1.0, scheme="all", weights=final, config=cfg, model=info,
                    training={"gradient_canaries": record})


def test_gradient_canaries_separate_members_with_the_engine_sign(tmp_path):
    run = _white_box_run(tmp_path, signal=10.0)
    ev = gradient_canary_evidence(run=open_run(run, verify=False))
    assert isinstance(ev, Evidence) and not ev.black_box and ev.m == 300
    assert ev.provenance["dim"] == 192 * 64 + 64  # the frozen head is not spanned
    assert ev.scores[ev.included].min() > ev.scores[~ev.included].max()  # higher = member
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("gradient_canaries",)))
    assert report.verdict.status == "VIOLATION" and report.verdict.best_source == "gradient_canaries"
    assert read(run)["estimates"][0]["extra"]["evidence"]["dim"] == ev.provenance["dim"]


def test_gradient_canaries_without_signal_are_consistent(tmp_path):
    run = _white_box_run(tmp_path, signal=0.0)
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("gradient_canaries",)))
    assert report.verdict.status == "CONSISTENT" and report.verdict.best_epsilon_lb < 1.0


def test_gradient_canaries_refuse_files_that_do_not_match_the_record(tmp_path):
    run = _white_box_run(tmp_path, signal=5.0)
    mask = np.load(run / "gradient_canaries.npy")
    write_npy(run / "gradient_canaries.npy", ~mask)
    with pytest.raises(CheckpointError, match="gradient_canaries.npy does not match the sha256"):
        gradient_canary_evidence(run=open_run(run, verify=False))
    write_npy(run / "gradient_canaries.npy", mask)
    (run / "model_init.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model_init.safetensors named in the manifest"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("gradient_canaries",)))


def test_gradient_canaries_are_skipped_for_runs_without_a_record(tmp_path):
    run = make_run(tmp_path / "imported")
    ev = gradient_canary_evidence(run=open_run(run, verify=False))
    assert isinstance(ev, Skipped) and "records no gradient canaries" in ev.reason


# ------------------------------------------------------------------------------------ completeness, config, CLI


def test_epsilon_is_complete_tracks_config_scores_and_weights(tmp_path):
    run = make_run(tmp_path / "r")
    cfg = EpsilonConfig(sources=("pool",))
    assert not epsilon_is_complete(run, cfg)
    write_scores(run, signal=1.0)
    run_epsilon(run_dir=run, config=cfg)
    assert epsilon_is_complete(run, cfg)
    assert not epsilon_is_complete(run, EpsilonConfig(sources=("pool",), alpha=0.01))
    write_scores(run, signal=1.0, seed=7)
    assert not epsilon_is_complete(run, cfg)


def test_k_grid_and_config_validation():
    kp, kn = k_grids(1000, points=8, guesses="in_out")
    assert kp[0] == 10 and kp[-1] == 500 and np.array_equal(kp, kn) and kp.max() + kn.max() <= 1000
    assert k_grids(6, points=8, guesses="in")[0].tolist() == [3]
    with pytest.raises(ValueError, match="m must be >= 2"):
        k_grids(1, points=3, guesses="in")
    with pytest.raises(ValueError, match="unknown attack"):
        EpsilonConfig(attack="nope")
    with pytest.raises(ValueError, match="duplicates"):
        EpsilonConfig(sources=("pool", "pool"))


def test_cli_prints_table_and_verdict_and_rejects_bad_options(tmp_path):
    from audit.cli import main

    run = make_run(tmp_path / "r", epsilon=1.0)
    write_scores(run, signal=6.0)
    result = CliRunner().invoke(main, ["epsilon", str(run), "--sources", "pool", "--alpha", "0.1"])
    assert result.exit_code == 0, result.output
    assert "VIOLATION: best ε_lb" in result.output and "one_run" in result.output
    assert read(run)["alpha"] == 0.1
    bad = CliRunner().invoke(main, ["epsilon", str(run), "--sources", "pool,bogus"])
    assert bad.exit_code == 2 and "error:" in bad.output and "sources" in bad.output
    missing = CliRunner().invoke(main, ["epsilon", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "run directory not found" in missing.output


def test_config_error_type_is_user_error():
    assert issubclass(ConfigError, UserError)


def test_epsilon_options_are_merged_onto_the_config_without_a_shell(tmp_path):
    from audit.config import resolve_epsilon_config

    path = tmp_path / "exp.yaml"
    path.write_text("name: exp\nepsilon: {alpha: 0.2, attack: loss, k_grid_points: 2}\n")
    cfg = resolve_epsilon_config(config_path=path, sources="pool, input_canaries", guesses="in")
    assert (cfg.alpha, cfg.attack, cfg.k_grid_points, cfg.guesses) == (0.2, "loss", 2, "in")
    assert cfg.sources == ("pool", "input_canaries")
    assert resolve_epsilon_config(config_path=path, alpha=0.01, attack="rmia_online").alpha == 0.01
    assert resolve_epsilon_config() == EpsilonConfig()
    with pytest.raises(ConfigError, match="sources"):
        resolve_epsilon_config(sources="pool,telepathy")
    with pytest.raises(ConfigError, match="unknown attack 'lira'"):
        resolve_epsilon_config(attack="lira")


def test_forged_claim_is_a_violation_whatever_the_evidence(tmp_path):
    """Weak evidence (CONSISTENT on its own), but the manifest's ε was edited below what σ, q, T support."""
    run = make_run(tmp_path / "r", epsilon=4.0)
    write_scores(run, signal=0.0)
    honest = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    assert honest.verdict.status == "CONSISTENT" and honest.verdict.findings == ()
    manifest = read_manifest(run)
    write_manifest(run, manifest.model_copy(update={"privacy": manifest.privacy.model_copy(update={"epsilon": 0.5})}))
    assert not epsilon_is_complete(run, EpsilonConfig(sources=("pool",)))  # the claim changed: recompute
    forged = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    assert forged.verdict.status == "VIOLATION" and forged.verdict.best_epsilon_lb < 0.5
    assert forged.verdict.notes[0].startswith("claim does not follow from the stated mechanism: ε(PLD) = ")
    assert read(run)["verdict"]["findings"][0]["severity"] == "error"
    assert read(run)["verdict"]["findings"][0]["kind"] == "claim_not_from_mechanism"
    from audit.reporting.build import build_report
    from audit.reporting.inputs import load_run

    glance = build_report(load_run(run)).glance
    assert glance.status == "VIOLATION" and "not supported by the run's own record" in glance.summary
