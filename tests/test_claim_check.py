"""The claim is recomputed from its stated mechanism and cross-examined against config, metrics and provenance.

Honest manifests are made the way the trainer makes them (:func:`training.accounting.cross_check` of the DP phases);
forged ones edit one field at a time. Every forgery must give an ``error`` finding naming the numbers, every honest
claim none.
"""

from __future__ import annotations

import pytest
import yaml

from audit.bounds.claim_check import (check_claim, check_config, check_mechanism, check_metrics, check_provenance,
                                       recompute_epsilon)
from training.accounting import DPPhase, cross_check, epsilon_for
from training.config import TrainConfig, dump_config
from training.run.manifest import DataInfo, Manifest, MembershipInfo, ModelInfo, PhaseInfo, PrivacyInfo, Provenance

N = 1000  # members


def _manifest(*, phases: list[tuple[float, float, int]], accountant: str = "prv", delta: float = 1e-5,
              epsilon: float | None = None, command: str | None = None, config_sha: str | None = None,
              extra_phases: list[PhaseInfo] = ()) -> Manifest:
    """A manifest whose claim is computed as the trainer computes it (unless ``epsilon`` overrides it)."""
    infos = [PhaseInfo(name=f"p{i}", dp=True, dataset="synthetic", noise_multiplier=s, sample_rate=q, steps=t,
                       batch_size=round(q * N), max_grad_norm=1.0, clipping="flat")
             for i, (s, q, t) in enumerate(phases)]
    claim = cross_check(phases=[DPPhase(s, q, t) for s, q, t in phases], delta=delta,
                        accountant=accountant)["epsilon"]
    privacy = PrivacyInfo(dp=True, delta=delta, accountant=accountant, epsilon=claim if epsilon is None else epsilon,
                          phases=[*extra_phases, *infos])
    return Manifest(
        run_name="r",
        model=ModelInfo(arch="mlp", num_classes=10, input_shape=(3, 8, 8), param_count=1, trainable_param_count=1,
                        weights_sha256="0" * 64),
        data=DataInfo(dataset="synthetic", split="train", pool_size=2 * N, pool_fingerprint="f",
                      membership_sha256="m", membership=MembershipInfo(scheme="bernoulli", p=0.5, seed=0,
                                                                      n_members=N, n_pool=2 * N)),
        privacy=privacy,
        provenance=Provenance(package_version="0", created="2025-01-01T00:00:00+00:00", command=command,
                              config_sha256=config_sha))


def _errors(findings) -> list[str]:
    return [f.message for f in findings if f.severity == "error"]


# ------------------------------------------------------------------------------------------------- mechanism


@pytest.mark.parametrize("accountant", ["prv", "rdp", "pld"])
@pytest.mark.parametrize("phases", [[(1.0, 0.05, 200)], [(4.0, 0.256, 40)], [(0.8, 0.01, 500), (1.5, 0.1, 30)]])
def test_honest_claims_follow_from_their_mechanism(phases, accountant):
    assert check_mechanism(_manifest(phases=phases, accountant=accountant).privacy) == ()


def test_recompute_matches_the_pld_accountant():
    m = _manifest(phases=[(0.8, 0.01, 500), (1.5, 0.1, 30)])
    want = epsilon_for(phases=[DPPhase(0.8, 0.01, 500), DPPhase(1.5, 0.1, 30)], delta=1e-5, accountant="pld")
    assert recompute_epsilon(m.privacy) == pytest.approx(want, rel=1e-12)


def test_edited_claim_does_not_follow():
    honest = _manifest(phases=[(1.0, 0.05, 200)])
    eps = recompute_epsilon(honest.privacy)
    forged = _manifest(phases=[(1.0, 0.05, 200)], epsilon=0.5)
    (msg,) = _errors(check_mechanism(forged.privacy))
    assert msg.startswith(f"claim does not follow from the stated mechanism: ε(PLD) = {eps:.4g} > claimed ε = 0.5")
    assert "σ=1" in msg and "q=0.05" in msg and "T=200" in msg


def test_tolerance_is_small_and_one_sided():
    eps = recompute_epsilon(_manifest(phases=[(1.0, 0.05, 200)]).privacy)
    assert check_mechanism(_manifest(phases=[(1.0, 0.05, 200)], epsilon=eps * 0.99).privacy) == ()
    assert _errors(check_mechanism(_manifest(phases=[(1.0, 0.05, 200)], epsilon=eps * 0.95).privacy))
    assert check_mechanism(_manifest(phases=[(1.0, 0.05, 200)], epsilon=eps * 10).privacy) == ()  # loose is fine


def test_claims_without_a_mechanism_are_errors():
    base = _manifest(phases=[(1.0, 0.05, 200)])
    nodp = base.privacy.model_copy(update={"phases": [base.privacy.phases[0].model_copy(update={"dp": False})]})
    assert "no phase is DP" in _errors(check_mechanism(nodp))[0]
    nosigma = base.privacy.model_copy(update={"phases": [base.privacy.phases[0].model_copy(
        update={"noise_multiplier": 0.0})]})
    assert "noise multiplier 0.0" in _errors(check_mechanism(nosigma))[0]
    nodelta = base.privacy.model_copy(update={"delta": None})
    assert "without a delta" in _errors(check_mechanism(nodelta))[0]


def test_imported_claim_without_phases_is_a_warning_only():
    m = _manifest(phases=[(1.0, 0.05, 200)])
    m = m.model_copy(update={"privacy": m.privacy.model_copy(update={"phases": []})})
    (f,) = check_claim(m)
    assert f.severity == "warning" and "cannot recompute" in f.message


def test_non_dp_phase_on_the_private_dataset_is_flagged():
    extra = [PhaseInfo(name="sneaky", dp=False, dataset="synthetic", steps=500)]
    (f,) = check_claim(_manifest(phases=[(1.0, 0.05, 200)], extra_phases=extra))
    assert f.severity == "warning" and "'sneaky'" in f.message


def test_no_claim_is_not_checked():
    m = _manifest(phases=[(1.0, 0.05, 200)])
    m = m.model_copy(update={"privacy": PrivacyInfo(dp=False)})
    assert check_claim(m, config={"privacy": {"enabled": False}}, metrics={"epsilon_spent": None}) == ()


# ---------------------------------------------------------------------------------------------- config/metrics


def _config(**privacy) -> dict:
    cfg = TrainConfig.model_validate({"privacy": {"noise_multiplier": 1.0, "delta": 1e-5, **privacy},
                                      "training": {"steps": 200, "batch_size": 50}})
    return yaml.safe_load(dump_config(cfg))


def test_honest_config_metrics_and_command_agree():
    m = _manifest(phases=[(1.0, 0.05, 200)], command="audit train q.yaml --set privacy.noise_multiplier=1.0")
    cfg = _config()
    metrics = {"epsilon_spent": m.privacy.epsilon, "steps": 200}
    assert check_claim(m, config=cfg, metrics=metrics) == ()


@pytest.mark.parametrize("edit, needle", [
    ({"enabled": False, "noise_multiplier": None}, "privacy.enabled is false"),
    ({"noise_multiplier": 14.0}, "privacy.noise_multiplier = 14"),
    ({"delta": 1e-3}, "privacy.delta = 0.001"),
    ({"max_grad_norm": 5.0}, "privacy.max_grad_norm = 5"),
    ({"sampling": "shuffle"}, "privacy.sampling = shuffle"),
    ({"noise_multiplier": None, "target_epsilon": 8.0}, "privacy.target_epsilon = 8"),
])
def test_config_contradictions_are_errors(edit, needle):
    m = _manifest(phases=[(1.0, 0.05, 200)])
    errors = _errors(check_config(m, _config(**edit)))
    assert errors and any(needle in e for e in errors), errors
    assert all(e.startswith("config.yaml contradicts the claim: ") for e in errors)


def test_config_batch_steps_and_hash():
    m = _manifest(phases=[(1.0, 0.05, 200)], config_sha="a" * 64)
    cfg = _config()
    cfg["training"]["batch_size"] = 100
    cfg["training"]["steps"] = 50
    errors = " | ".join(_errors(check_config(m, cfg, config_sha256="b" * 64)))
    assert "edited after training" in errors and "training.batch_size = 100" in errors
    assert "q = 0.1" in errors and "training.steps = 50" in errors
    bad = _errors(check_config(m, {"privacy": {"enabled": "maybe"}}))
    assert bad and "does not validate" in bad[0]


@pytest.mark.parametrize("metrics, needle", [
    ({"epsilon_spent": None}, "epsilon_spent = None"),
    ({"epsilon_spent": 8.0}, "epsilon_spent = 8.0"),
    ({"epsilon_spent": "0.5"}, "epsilon_spent = '0.5'"),
    ({"steps": 7}, "steps = 7"),
])
def test_metrics_contradictions_are_errors(metrics, needle):
    m = _manifest(phases=[(1.0, 0.05, 200)])
    (e,) = _errors(check_metrics(m, metrics))
    assert e.startswith("metrics.json contradicts the claim: ") and needle in e


@pytest.mark.parametrize("command", [
    "audit train q.yaml --set privacy.enabled=false",
    "audit train q.yaml --set=privacy.enabled=False --no-progress",
    "audit train q.yaml --set privacy.noise_multiplier=0",
])
def test_command_that_turned_dp_off_is_an_error(command):
    (e,) = _errors(check_provenance(_manifest(phases=[(1.0, 0.05, 200)], command=command)))
    assert e.startswith("the recorded command contradicts the claim")


def test_errors_come_first():
    extra = [PhaseInfo(name="sneaky", dp=False, dataset="synthetic", steps=5)]
    m = _manifest(phases=[(1.0, 0.05, 200)], epsilon=0.1, extra_phases=extra)
    found = check_claim(m, metrics={"epsilon_spent": None})
    assert [f.severity for f in found] == ["error", "error", "warning"]
