"""The experiment config: a training config plus the audit sections and named variants.

One YAML file drives `audit train`, `audit attack`, `audit epsilon`, `audit transfer`, `audit report` and
`audit run`. ``variants`` name sets of dotted overrides: each variant is its own run directory
(``<output_dir>/<name>-<variant>``), e.g. a DP target and a non-DP target from one file.

>>> cfg = RunConfig.model_validate({"name": "q", "variants": {"nondp": {"privacy.enabled": False}}})
>>> select_variant(cfg, "nondp").train_config().privacy.enabled
False
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from attacks.config import AttackConfig
from attacks.registry import attack_names
from training.config import Overrides, Strict, TrainConfig, apply_overrides, load_yaml, to_overrides, validate_config
from foundation.errors import ConfigError

__all__ = ["EpsilonConfig", "TransferRunConfig", "ReportConfig", "RunConfig", "load_run_config",
           "select_variant", "variant_names",
           "resolve_attack_config", "attacks_chosen", "resolve_epsilon_config"]

class EpsilonConfig(Strict):
    """Empirical epsilon settings (`audit epsilon`)."""

    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="1 - confidence of the verdict (shared by its bounds)")
    sources: tuple[Literal["pool", "input_canaries", "gradient_canaries", "multi_run",
                           "auditor_canaries"], ...] = Field(
        ("pool", "input_canaries", "gradient_canaries"),
        description="evidence sources; multi_run (trains multi_run_models models) only when listed; "
        "auditor_canaries needs canaries (the auditor's secret file)")
    attack: str = Field("strongest", description="attack whose scores feed the one-run estimator on the pool; "
                        "'strongest': the first of STRONGEST_FIRST that scores.npz holds (a fixed order, chosen "
                        "before looking at the scores, so the bound keeps its level)")
    guesses: Literal["in", "in_out"] = Field(
        "in_out", description="one-run guesses: top-k IN and bottom-k OUT (k_pos x k_neg grid), or top-k IN only")
    k_grid_points: int = Field(4, ge=1, le=64, description="geometric grid of k from 10 to m/2 (Bonferroni over it)")
    fdp: bool = Field(True, description="also run the one-run audit against a Gaussian trade-off curve")
    split_alpha: bool = Field(True, description="give each bound in the verdict alpha / (number of such bounds)")
    gaussian_in_verdict: Literal["auto", "never"] = Field(
        "auto", description="auto: Gaussian-curve bounds count toward the verdict when the claimed mechanism is "
        "exactly Gaussian (every DP phase full-batch, q = 1)")
    holdout_fraction: float = Field(0.5, gt=0.0, lt=1.0, description="pool CP/GDP: share used to pick the threshold")
    seed: int = Field(0, ge=0, description="tie-breaking and held-out split randomness")
    multi_run_models: int = Field(64, ge=4, description="multi_run: models trained, half with the canary (even)")
    multi_run_canary: Literal["mislabel", "ood"] = Field(
        "ood", description="multi_run canary: uniform-noise image with a fixed label, or a mislabelled test image")
    multi_run_seed: int = Field(0, ge=0, description="multi_run: the canary and the models' seeds")
    canaries: str | None = Field(None, description="auditor_canaries: the auditor's secret file (audit canaries make)")
    canary_references: int = Field(16, ge=2, description="auditor_canaries: reference models per set (even)")
    canary_reference_dir: str | None = Field(
        None, description="auditor_canaries: where reference sets are kept (None: <run>/canary_references); sets "
        "are keyed by what they were trained on, so one directory can serve many runs")
    canary_reference_seed: int = Field(0, ge=0, description="auditor_canaries: keep masks and model seeds")
    canary_sigma0: bool = Field(True, description="auditor_canaries: for a claimed-DP run also train references "
                                "without noise (sigma = 0) and score with the set that explains the target best")

    @model_validator(mode="after")
    def _check(self) -> "EpsilonConfig":
        if self.multi_run_models % 2:
            raise ValueError(f"epsilon.multi_run_models must be even (n with and n without the canary), got "
                             f"{self.multi_run_models}")
        if self.canary_references % 2:
            raise ValueError(f"epsilon.canary_references must be even (each canary IN for half), got "
                             f"{self.canary_references}")
        if "auditor_canaries" in self.sources and self.canaries is None:
            raise ValueError("epsilon.sources lists auditor_canaries but no secret file is given: pass "
                             "--canaries SECRET (the canary_secret.npz of 'audit canaries make')")
        if len(set(self.sources)) != len(self.sources):
            raise ValueError(f"epsilon.sources has duplicates: {list(self.sources)}")
        if self.attack != "strongest" and self.attack not in attack_names():
            raise ValueError(f"epsilon.attack: unknown attack '{self.attack}'; valid: strongest, "
                             f"{', '.join(attack_names())}")
        return self


class TransferRunConfig(Strict):
    suite: str | None = Field(None, description="transfer suite YAML (None: skip transfer in `audit run`)")


class ReportConfig(Strict):
    pdf: bool = False


class RunConfig(TrainConfig):
    """A training config plus the audit sections and variants."""

    attack: AttackConfig = Field(default_factory=AttackConfig)
    epsilon: EpsilonConfig = Field(default_factory=EpsilonConfig)
    transfer: TransferRunConfig = Field(default_factory=TransferRunConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)
    variant: str | None = Field(None, description="set by select_variant; not for hand-written configs")

    def train_config(self) -> TrainConfig:
        keys = set(TrainConfig.model_fields)
        return TrainConfig.model_validate({k: v for k, v in self.model_dump().items() if k in keys})


def variant_names(cfg: RunConfig) -> list[str]:
    return list(cfg.variants) or [None]  # type: ignore[list-item]


def select_variant(cfg: RunConfig, name: str | None) -> RunConfig:
    """The config of one variant: its overrides applied, run name ``<name>-<variant>``."""
    if not cfg.variants:
        if name is not None:
            raise ConfigError(f"--variant {name}: this config defines no variants")
        return cfg
    if name is None:
        raise ConfigError(f"this config defines variants ({', '.join(cfg.variants)}): pass --variant NAME "
                          f"(audit run runs them all)")
    if name not in cfg.variants:
        raise ConfigError(f"unknown variant '{name}'; this config defines: {', '.join(cfg.variants)}")
    data = cfg.model_dump(exclude_unset=True)  # defaults that follow other keys (a non-DP run shuffles) re-derive
    data.pop("variants", None)
    data = apply_overrides(data, dict(cfg.variants[name]))
    data["name"] = f"{cfg.name}-{name}"
    data["variant"] = name
    return validate_config(data, RunConfig, source=f"variant '{name}'")


def load_run_config(path: str | os.PathLike[str], overrides: Overrides = ()) -> RunConfig:
    """Load an experiment YAML with overrides (``--set`` strings, typed pairs or a mapping whose values are set as
    given) into a validated :class:`RunConfig`."""
    data = apply_overrides(load_yaml(path), overrides)
    cfg = validate_config(data, RunConfig, source=f"config error in {path}")
    for name in cfg.variants:  # validate every variant now, so a typo fails before any training
        select_variant(cfg, name)
    return cfg


def resolve_attack_config(*, run_dir: str | os.PathLike[str], config_path: str | os.PathLike[str] | None = None,
                          variant: str | None = None, overrides: Overrides = ()) -> AttackConfig:
    """The attack settings for a run: the ``attack:`` section of ``config_path`` (its variant for this run), or
    the defaults, with ``--set`` overrides applied.

    Without a config file only ``attack.*`` keys may be overridden. With one, the variant is ``variant`` or
    the one whose run name (``<name>-<variant>``) is the run directory's name.

    >>> resolve_attack_config(run_dir="r", overrides=("attack.n_reference=4",)).n_reference
    4

    Raises:
        ConfigError: unknown keys or values, a non-``attack.*`` override without a config file, or an
            ambiguous variant.
    """
    pairs = to_overrides(overrides)
    if config_path is None:
        bad = [".".join(parts) for parts, _ in pairs if parts[0] != "attack"]
        if bad:
            raise ConfigError(f"--set {bad[0]}: audit attack only takes attack.* settings (training settings are "
                              f"fixed by the run); pass --config to read a whole experiment file")
        data = apply_overrides({"attack": {}}, pairs)
        return validate_config(data["attack"] or {}, AttackConfig, source="attack settings")
    cfg = load_run_config(config_path, pairs)
    if cfg.variants and variant is None:
        names = [v for v in cfg.variants if f"{cfg.name}-{v}" == Path(run_dir).name]
        variant = names[0] if names else None
    return select_variant(cfg, variant).attack


def attacks_chosen(*, config_path: str | os.PathLike[str] | None, overrides: Overrides) -> bool:
    """Whether the user chose the attacks: a config file, or an ``attack.attacks`` override."""
    return config_path is not None or any(parts == ("attack", "attacks") for parts, _ in to_overrides(overrides))


def resolve_epsilon_config(*, config_path: str | os.PathLike[str] | None = None, alpha: float | None = None,
                           sources: str | tuple[str, ...] | None = None, attack: str | None = None,
                           guesses: str | None = None, canaries: str | None = None,
                           reference_dir: str | None = None) -> EpsilonConfig:
    """The ε settings: the ``epsilon:`` section of ``config_path`` (or the defaults) with each given option on top.

    Args:
        config_path: experiment YAML whose ``epsilon`` section supplies the defaults.
        alpha, attack, guesses: replace the setting when not None.
        sources: the evidence sources, as a comma-separated string or a tuple (None: keep; with ``canaries``
            and no sources given: ``auditor_canaries`` alone).
        canaries: the auditor's secret file; reference_dir: where its reference sets are kept.

    >>> resolve_epsilon_config(alpha=0.01, sources="pool, input_canaries").sources
    ('pool', 'input_canaries')

    Raises:
        ConfigError: an unknown source, attack or value (one line).
    """
    base = load_run_config(config_path).epsilon if config_path is not None else EpsilonConfig()
    data = base.model_dump()
    if isinstance(sources, str):
        sources = tuple(s.strip() for s in sources.split(",") if s.strip())
    if canaries is not None and sources is None:
        sources = ("auditor_canaries",)
    given = {"alpha": alpha, "sources": sources, "attack": attack, "guesses": guesses, "canaries": canaries,
             "canary_reference_dir": reference_dir}
    data.update({k: v for k, v in given.items() if v is not None})
    return validate_config(data, EpsilonConfig, source="audit epsilon options")
