"""Typed, strict, frozen configuration for training.

A YAML file is only a serialisation of these objects: it is read with ``yaml.safe_load``, unknown or misspelt
keys are errors that name the key and the valid ones, and ``--set a.b=value`` overrides are applied before
validation. Each model validates itself; the resolved config is saved in every run directory.

>>> cfg = TrainConfig.model_validate({"name": "demo", "privacy": {"target_epsilon": 8.0}})
>>> cfg.privacy.enabled, cfg.privacy.target_epsilon, cfg.data.dataset
(True, 8.0, 'digits')
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (BaseModel, Field, SerializationInfo, SerializerFunctionWrapHandler, ValidationError,
                      field_validator, model_serializer, model_validator)

from foundation.errors import ConfigError
from training.strict import Strict

#: Largest ``privacy.target_epsilon``. ε bounds the ratio of any outcome's probability with and without one example
#: by e^ε: at ε = 100 that is 2.7e43, a guarantee that rules out no attack (deployed DP uses ε ≲ 10), and the
#: calibration already lands near σ ≈ 0.15-0.3, where the tight accountants fall back to RDP. Above it (ε = 1e9
#: calibrated to σ ≈ 0.001, the search's floor) a "DP" run is a non-DP run with a meaningless label; train
#: without DP with ``privacy.enabled: false``.
MAX_TARGET_EPSILON = 100.0

#: Largest ``data.image_size``: a pool is held in memory as uint8 N×S×S×3 (S = 1024: 3 MB per image).
MAX_IMAGE_SIZE = 1024

#: Largest seed: every random stream (numpy, torch) takes a signed 64-bit integer.
MAX_SEED = 2**63 - 1

#: Largest learning rate (and weight decay): float32 (the optimizers' parameter type) holds nothing above ~3.4e38.
#: Any value near it diverges in the first steps, which training reports in one line.
MAX_LR = 1e38

#: Noise multipliers a DP run may use: below the floor no accountant gives a finite ε (the run is non-private:
#: ``privacy.enabled: false``); above the ceiling the noise is ~1e4 clipping norms per step, nothing is learnt.
MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER = 1e-3, 1e4

__all__ = [
    "MAX_IMAGE_SIZE",
    "MAX_TARGET_EPSILON",
    "MAX_SEED",
    "MAX_LR",
    "Strict",
    "DataConfig",
    "ModelConfig",
    "PrivacyConfig",
    "OptimConfig",
    "CanaryConfig",
    "GradientCanaryConfig",
    "HessianLogConfig",
    "AugmentConfig",
    "EMAConfig",
    "ContinualConfig",
    "FinetuneConfig",
    "TrainingConfig",
    "TrainConfig",
    "load_yaml",
    "safe_load_yaml",
    "Overrides",
    "apply_overrides",
    "parse_override",
    "to_overrides",
    "validate_config",
    "load_config",
    "dump_config",
]


class DataConfig(Strict):
    dataset: str = Field("digits", description="dataset registry name (digits, synthetic, npz, cifar10, ...)")
    root: str | None = Field(None, description="data root on local disk (path to the .npz file for 'npz')")
    split: str = Field("train", description="split the training pool is drawn from")
    test_split: str | None = Field("test", description="split used for test accuracy (None: no test set)")
    image_size: int | None = Field(None, gt=0, le=MAX_IMAGE_SIZE,
                                   description="resize images to this square size (None: native)")
    pool_size: int | None = Field(None, gt=0, description="use a subset of this many examples (pool_selection)")
    pool_seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of the pool subset (pool_selection: random)")
    pool_selection: Literal["random", "first"] = Field(
        "random", description="which pool_size rows (and test_size test rows): a seeded uniform subset, or the "
        "first rows of the split in its stored order (to reproduce a setup that took the first N)")
    test_size: int | None = Field(None, gt=0, description="cap on the number of test examples")
    audit_split: bool = Field(True, description="members drawn by independent Bernoulli(member_prob)")
    member_prob: float = Field(0.5, gt=0.0, lt=1.0)
    membership_seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of the Bernoulli membership draw")
    download: bool = Field(False, description="allow torchvision to download (needs internet)")
    stream: bool | Literal["auto"] = Field(
        "auto", description="decode image files on the fly instead of holding the pool in memory (auto: when a "
        "file-backed pool exceeds 4 GiB decoded; the test set follows the pool; array sets never stream)")
    workers: int = Field(4, ge=0, le=256, description="DataLoader worker processes decoding a streamed set")


class ModelConfig(Strict):
    arch: str = Field("small_cnn", description="registry name, timm name, or 'package.module:factory'")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="extra keyword arguments for the factory")
    pretrained: str | None = Field(None, description="local weights file (.safetensors, or .pt/.pth/.th)")
    cifar_stem: bool = Field(True, description="small-image defaults (3x3 ResNet stem, ViT patch 4)")
    fix_batchnorm: bool = Field(True, description="replace BatchNorm with GroupNorm for DP")
    freeze: tuple[str, ...] = Field((), description="glob patterns of parameter names to freeze")
    normalize_mean: tuple[float, float, float] | None = None
    normalize_std: tuple[float, float, float] | None = None


class PrivacyConfig(Strict):
    enabled: bool = True
    noise_multiplier: float | None = Field(None, ge=0.0, le=MAX_NOISE_MULTIPLIER)
    target_epsilon: float | None = Field(None, description="calibrate sigma to reach this epsilon")
    delta: float | None = Field(None, description="delta (None: 1/(10 * n_members) rounded down to 1eK)")
    max_grad_norm: float = Field(1.0, gt=0.0)
    clipping: Literal["flat", "per_layer", "automatic"] = "flat"
    auto_gamma: float = Field(0.01, gt=0.0, description="gamma in automatic clipping g/(||g||+gamma)")
    sampling: Literal["poisson", "shuffle"] = Field(
        "poisson", description="poisson (what the DP analysis assumes); a non-DP run defaults to shuffle (epochs "
        "of fixed-size batches, as non-private training does)")
    accountant: Literal["prv", "rdp", "pld"] = "prv"
    grad_sample_mode: Literal["hooks", "functorch", "ghost", "bk", "fused"] = "hooks"
    secure_mode: bool = False

    @model_validator(mode="before")
    @classmethod
    def _non_dp_shuffles(cls, data: Any) -> Any:
        """Without DP nothing needs Poisson batches: unless ``sampling`` is set, a non-DP run shuffles."""
        if isinstance(data, dict) and data.get("enabled") is False and "sampling" not in data:
            return {**data, "sampling": "shuffle"}
        return data

    @model_validator(mode="after")
    def _check(self) -> "PrivacyConfig":
        sigma = self.noise_multiplier
        if self.enabled and sigma is not None and 0 < sigma < MIN_NOISE_MULTIPLIER:
            raise ValueError(f"privacy.noise_multiplier must be 0 or at least {MIN_NOISE_MULTIPLIER:g}, got {sigma:g}: "
                             f"below that no accountant gives a finite ε; train without DP with "
                             f"privacy.enabled=false")
        if self.target_epsilon is not None and not self.target_epsilon > 0:
            raise ValueError(f"privacy.target_epsilon must be > 0, got {self.target_epsilon}")
        if self.enabled and self.target_epsilon is not None and self.target_epsilon > MAX_TARGET_EPSILON:
            raise ValueError(f"privacy.target_epsilon={self.target_epsilon:g} is above {MAX_TARGET_EPSILON:g}: an "
                             f"epsilon that large bounds no attack (each outcome's odds may change by e^epsilon; "
                             f"meaningful guarantees are epsilon <= ~10); set privacy.enabled: false to train "
                             f"without DP")
        if self.delta is not None and not 0.0 < self.delta < 1.0:
            raise ValueError(f"privacy.delta must be in (0, 1), got {self.delta}")
        if self.enabled and self.noise_multiplier is not None and not self.noise_multiplier > 0:
            raise ValueError(f"privacy.noise_multiplier must be > 0 when privacy is enabled (sigma = 0 adds no noise "
                             f"and supports no finite epsilon), got {self.noise_multiplier}; set privacy.enabled: "
                             f"false to train without DP")
        if self.enabled and self.noise_multiplier is not None and self.target_epsilon is not None:
            raise ValueError("give privacy.noise_multiplier or privacy.target_epsilon, not both")
        if self.enabled and self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError("privacy is enabled: set privacy.target_epsilon or privacy.noise_multiplier")
        return self


class OptimConfig(Strict):
    name: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = Field(0.1, gt=0.0, description=f"learning rate, at most {MAX_LR:g} (float32)")
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam/AdamW betas, each in [0, 1)")
    schedule: Literal["constant", "cosine", "step", "linear"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    step_size: int = Field(1000, gt=0, description="steps between decays for 'step'")
    gamma: float = Field(0.1, gt=0.0, description="decay factor for 'step'")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    lr_scales: dict[str, float] = Field(default_factory=dict, description="learning-rate multipliers by parameter-name "
                                        "glob, e.g. {'net.head.*': 5.0}: one parameter group per parameter")

    @field_validator("lr", "weight_decay")
    @classmethod
    def _float32(cls, v: float, info: Any) -> float:
        if v > MAX_LR:
            raise ValueError(f"optim.{info.field_name} must be at most {MAX_LR:g} (the optimizers hold it in float32), "
                             f"got {v:g}")
        return v

    @field_validator("betas")
    @classmethod
    def _betas_in_unit_interval(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError(f"optim.betas must both be in [0, 1) (Adam's moment decay rates), got {list(v)}")
        return v

    @field_validator("lr_scales")
    @classmethod
    def _positive_scales(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not x > 0}
        if bad:
            raise ValueError(f"optim.lr_scales must be > 0, got {bad}")
        return v


class CanaryConfig(Strict):
    """Input canaries inserted into the training pool: generated from ``count``/``kind``/``seed`` (each included
    with probability 1/2), or an auditor's package (``from_file``, :mod:`training.canary_package`: every package
    canary is a member; the auditor keeps the inclusion bits)."""

    count: int = Field(0, ge=0)
    kind: Literal["mislabel", "ood"] = "mislabel"
    seed: int = Field(0, ge=0, le=MAX_SEED)
    from_file: str | None = Field(None, description="an auditor's canary package (.npz from 'audit canaries make')")

    @model_validator(mode="after")
    def _one_source(self) -> "CanaryConfig":
        if self.from_file is not None and self.count:
            raise ValueError(f"training.canaries: give count ({self.count}) or from_file, not both (the auditor's "
                             "package fixes its own count)")
        return self


class GradientCanaryConfig(Strict):
    """White-box gradient canaries (Steinke, Nasr, Jagielski 2023): m random unit directions."""

    count: int = Field(0, ge=0)
    seed: int = Field(0, ge=0, le=MAX_SEED)


class HessianLogConfig(Strict):
    """Hutchinson tr(H) and decelerator sigma^2 tr(H) / (B c^2) logging."""

    every: int = Field(0, ge=0, description="log every N steps (0: off)")
    probes: int = Field(8, gt=0)
    batch_size: int = Field(256, gt=0)


class AugmentConfig(Strict):
    """Training-time augmentation, applied on the device to each step's tensor batch (:mod:`training.augment`).

    Every example of a step gets its own random translation by (dy, dx), each uniform in [-crop_padding,
    crop_padding] (a random crop of the image padded by ``crop_padding``), and a horizontal flip with probability
    1/2; the draws come from the run's seeded stream of that step (``derive_seed(seed, AUGMENT, step)``), so a
    resumed run repeats them. ``multiplicity`` K > 1 (De et al. 2022, "Unlocking High-Accuracy Differentially
    Private Image Classification through Scale") trains on K augmented copies of every sampled example and
    averages the copies' gradients into that example's gradient *before* clipping: the example still
    contributes one clipped gradient, so the DP analysis is unchanged. Signals never see this augmentation
    (LiRA's queries are ``attack.augmentations``)."""

    crop_padding: int = Field(0, ge=0, le=64, description="random-crop padding in pixels (0: no crop; CIFAR: 4)")
    padding_mode: Literal["reflect", "zeros"] = Field(
        "reflect", description="how the crop's border is filled: mirror of the image (reflect) or black (zeros)")
    flip: bool = Field(False, description="random horizontal flip with probability 1/2")
    multiplicity: int = Field(1, ge=1, le=64, description="augmented copies per example, gradients averaged "
                              "before clipping (De et al. 2022); 1: one copy")

    @property
    def active(self) -> bool:
        """Whether any example is transformed."""
        return self.crop_padding > 0 or self.flip


class EMAConfig(Strict):
    """Exponential moving average of the weights, θ_ema ← d·θ_ema + (1 − d)·θ after every step; with EMA on,
    the EMA weights are what is evaluated, saved as the model and audited (DP: post-processing, the claim is
    unchanged)."""

    decay: float | None = Field(None, gt=0.0, lt=1.0, description="EMA decay d (None: no EMA; e.g. 0.999)")
    warmup: bool = Field(True, description="use min(d, (1 + t) / (10 + t)) at step t, so short runs are not "
                         "dominated by the initial weights")


class ContinualConfig(Strict):
    """DP continual pre-training (Bu et al. 2024): public non-DP phase, then private DP phase."""

    public: DataConfig = Field(default_factory=lambda: DataConfig(audit_split=False))
    switch: Literal["steps", "plateau", "decelerator"] = "steps"
    switch_steps: int = Field(100, ge=0, description="'steps': switch after this many public steps")
    max_public_steps: int = Field(1000, ge=0, description="upper bound on public steps for any rule")
    plateau_patience: int = Field(3, gt=0)
    plateau_min_delta: float = Field(1e-3, ge=0.0)
    eval_every: int = Field(20, gt=0, description="public-validation / decelerator check interval")
    decelerator_threshold: float = Field(1.0, gt=0.0, description="decelerator rule: switch once σ²·tr(H)/(B·c²) is "
                                         "in [0, threshold); negative values (tr(H) < 0) never switch")
    public_lr: float | None = Field(None, gt=0.0, description="learning rate of the public phase (None: optim.lr)")
    public_batch_size: int | None = Field(None, gt=0, description="public phase batch size (None: training.batch_size)")
    count_public_steps: bool = Field(
        False, description="training.steps counts public + private steps (the private phase gets what the public "
        "phase left, sigma calibrated for those); false: training.steps is the private phase's length")
    optimizer_state: Literal["keep", "reset_first", "reset_both"] = "keep"


class FinetuneConfig(Strict):
    """DP fine-tuning from a checkpoint (Ke et al.): lp, fft or lp_fft."""

    checkpoint: str | None = Field(None, description="run directory or weights file to start from")
    strategy: Literal["lp", "fft", "lp_fft"] = "fft"
    split_by: Literal["epsilon", "steps"] = "steps"
    lp_fraction: float = Field(0.5, gt=0.0, lt=1.0, description="share of the budget given to LP")
    head_init: Literal["zero", "random", "keep"] = "zero"
    lp_lr: float | None = Field(None, gt=0.0, description="learning rate of the LP phase (None: optim.lr)")
    lp_steps_fraction: float | None = Field(
        None, gt=0.0, lt=1.0, description="split_by epsilon: LP's share of the steps (None: lp_fraction)")


class TrainingConfig(Strict):
    recipe: Literal["standard", "continual_pretrain", "finetune"] = "standard"
    steps: int | None = Field(None, gt=0, description="number of (logical) optimizer steps")
    epochs: float | None = Field(None, gt=0.0, description="alternative to steps: epochs over the members")
    batch_size: int = Field(256, gt=0, description="expected logical batch size (q = batch_size / n)")
    physical_batch_size: int = Field(256, gt=0, description="largest batch held in memory at once")
    eval_every: int = Field(0, ge=0, description="evaluate test accuracy every N steps (0: at the end)")
    log_every: int = Field(10, gt=0)
    checkpoint_every: int = Field(50, gt=0, description="save resumable state every N steps")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int | None = Field(0, ge=0, le=MAX_SEED,
                             description="seed of every random stream (null: secure mode, no seed)")
    progress: bool = True
    canaries: CanaryConfig = Field(default_factory=CanaryConfig)
    gradient_canaries: GradientCanaryConfig = Field(default_factory=GradientCanaryConfig)
    hessian: HessianLogConfig = Field(default_factory=HessianLogConfig)
    continual: ContinualConfig = Field(default_factory=ContinualConfig)
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig)
    augment: AugmentConfig = Field(default_factory=AugmentConfig)
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="label smoothing of the cross-entropy loss")
    ema: EMAConfig = Field(default_factory=EMAConfig)
    channels_last: bool = Field(False, description="channels-last memory format for model and batches (GPU convs)")
    precision: Literal["fp32", "tf32", "bf16"] = Field(
        "fp32", description="tf32: TF32 matmuls on CUDA; bf16: bfloat16 autocast. Only non-DP phases and "
        "evaluation use them: DP phases compute per-sample gradients and clip in strict fp32")
    compile: bool = Field(False, description="torch.compile the model's steps in non-DP phases; falls back "
                          "with a warning when compiling fails")

    @model_validator(mode="after")
    def _check(self) -> "TrainingConfig":
        if self.steps is None and self.epochs is None:
            raise ValueError("set training.steps or training.epochs")
        if self.steps is not None and self.epochs is not None:
            raise ValueError("give training.steps or training.epochs, not both")
        if self.ema.decay is not None and self.recipe != "standard":
            raise ValueError(f"training.ema applies to training.recipe: standard only, got {self.recipe!r}")
        if self.ema.decay is not None and self.gradient_canaries.count:
            raise ValueError("training.ema cannot be combined with training.gradient_canaries: the white-box audit "
                             "needs the final weights of the DP steps themselves, not their average")
        return self

    @model_serializer(mode="wrap")
    def _omit_new_defaults(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        """Leave the options added after the first release out of the dump while they hold their defaults, so the
        resolved ``config.yaml`` (and its sha256, which resume and completed-run checks compare) of a config that
        does not use them is byte-identical to what earlier versions wrote."""
        data = handler(self)
        if isinstance(data, dict):
            for key in _OMIT_AT_DEFAULT:
                if key in data and getattr(self, key) == TrainingConfig.model_fields[key].get_default(
                        call_default_factory=True):
                    del data[key]
        return data


_OMIT_AT_DEFAULT = ("augment", "label_smoothing", "ema", "channels_last", "precision", "compile")


class TrainConfig(Strict):
    """Everything `audit train` needs. The audit layer extends it with attack/epsilon/report sections."""

    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    output_dir: str = "results"
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    privacy: PrivacyConfig = Field(default_factory=lambda: PrivacyConfig(target_epsilon=8.0))
    optim: OptimConfig = Field(default_factory=OptimConfig)
    training: TrainingConfig = Field(default_factory=lambda: TrainingConfig(steps=100))

    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    @model_validator(mode="after")
    def _secure_mode_has_no_seed(self) -> "TrainConfig":
        """Secure mode draws its randomness from the OS CSPRNG: a configured seed (public in config.yaml) would
        make the noise and the batches predictable, so it is refused (as Opacus refuses one in secure mode)."""
        tc = self.training
        if self.privacy.enabled and self.privacy.secure_mode:
            if "seed" in tc.model_fields_set and tc.seed is not None:
                raise ValueError(f"privacy.secure_mode: a seed is prohibited in secure mode (training.seed="
                                 f"{tc.seed}); remove training.seed: secure runs draw noise and batches from the OS "
                                 "CSPRNG")
            if tc.seed is not None:
                return self.model_copy(update={"training": tc.model_copy(update={"seed": None})})
        elif tc.seed is None:
            raise ValueError("training.seed is null, which only secure mode allows; set an integer seed or "
                             "privacy.secure_mode: true")
        return self


# ----------------------------------------------------------------------------------------- loading

from foundation.config_io import (Overrides, apply_overrides, format_validation_error, load_yaml,  # noqa: E402
                                  parse_override, safe_load_yaml, to_overrides)


def validate_config(data: dict[str, Any], model: type[BaseModel] = TrainConfig, *, source: str = "config") -> Any:
    """Validate a mapping into ``model``; any problem becomes a one-line :class:`ConfigError`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, source)) from None


def load_config(path: str | os.PathLike[str], overrides: Overrides = (),
                model: type[BaseModel] = TrainConfig) -> Any:
    """Load YAML, apply overrides (``--set`` strings or a typed mapping), validate into ``model``."""
    data = apply_overrides(load_yaml(path), overrides)
    return validate_config(data, model, source=f"config error in {path}")


def dump_config(cfg: BaseModel) -> str:
    """The resolved config as YAML (every default written out), for the run directory."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
