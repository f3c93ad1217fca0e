"""The target's training recipe, as reference (shadow) models copy it.

LiRA and RMIA compare the target with reference models trained *the same way* on random halves of the pool
(Carlini et al., "Membership Inference Attacks From First Principles", S&P 2022, Sec. IV). "The same way"
includes DP: the reference models use the target's noise multiplier sigma (read from its manifest, not
re-calibrated), clipping norm C, sample rate q, number of steps, optimizer and learning-rate schedule.

Each reference model trains on about half of the pool, so its expected batch size is ``round(q * n / 2)``
(the target's q, whether the target trained on half the pool or on all of it). :func:`shadow_recipe` derives
all of it once from the target's config and manifest; :attr:`ShadowRecipe.train` is the
:class:`~training.dp.recipe.TrainRecipe` the batched engine runs, and :func:`shadow_config` the config the
regular trainer runs.

:func:`recipe_hash` identifies a recipe: the sha256 of the target's resolved config without the keys that
do not change how a model is trained (:data:`NOT_RECIPE`). Reference models are re-used only under the same
hash and the same pool fingerprint.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

from torch import nn

from training.config import ModelConfig, OptimConfig, TrainConfig  # noqa: F401 (OptimConfig: the doctest)
from training.dp.batched.engine import check_model
from training.dp.recipe import TrainRecipe
from foundation.errors import ConfigError, UserError
from foundation.io import sha256_bytes
from training.run.manifest import Manifest, PhaseInfo
from training.models import build_model

__all__ = ["NOT_RECIPE", "recipe_hash", "ShadowRecipe", "shadow_recipe", "shadow_config", "model_factory",
           "batched_unsupported", "BATCHED_ARCHS"]

NOT_RECIPE: tuple[str, ...] = (
    "name", "output_dir", "data.membership_seed", "training.seed", "training.progress", "training.log_every",
    "training.checkpoint_every", "training.eval_every", "training.device", "training.channels_last",
    "training.compile")
"""Config keys left out of :func:`recipe_hash`: names, where outputs go, seeds (reference models draw their own)
and logging/device/layout settings, none of which changes the distribution of the trained model (the training
augmentation, label smoothing, EMA and precision do, and stay in)."""


def recipe_hash(cfg: TrainConfig) -> str:
    """sha256 of the training config's non-default values, without the keys in :data:`NOT_RECIPE`.

    Only values that differ from the field defaults enter the hash, so a config written before a new
    option (with a default) was added keeps its hash.

    >>> a = TrainConfig.model_validate({"name": "a", "data": {"membership_seed": 1}})
    >>> b = TrainConfig.model_validate({"name": "b", "data": {"membership_seed": 2}})
    >>> c = b.model_copy(update={"optim": OptimConfig(lr=1)})
    >>> recipe_hash(a) == recipe_hash(b), recipe_hash(a) == recipe_hash(c)
    (True, False)
    """
    data = cfg.model_dump(mode="json", exclude_defaults=True)
    for key in NOT_RECIPE:
        node, *path = key.split(".")
        parent, leaf = (data, node) if not path else (data.get(node, {}), path[0])
        parent.pop(leaf, None)
    return sha256_bytes(json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShadowRecipe:
    """What every reference model of one target copies.

    Attributes:
        config: the target's training config (``config.yaml``).
        hash: :func:`recipe_hash` of ``config``.
        dp: whether the target trained with DP-SGD.
        noise_multiplier: the target's sigma (from its manifest), None without DP.
        max_grad_norm: clipping norm C (None without DP).
        sample_rate: the target's sampling rate q.
        batch_size: expected batch size of a reference model, ``round(q * n_pool / 2)``.
        steps: number of optimizer steps.
        delta: the target's delta (None without DP).
        accountant: the target's accountant (None without DP).
        n_phases: phases in the target's manifest (only single-phase recipes are pinned exactly).
    """

    config: TrainConfig
    hash: str
    dp: bool
    noise_multiplier: float | None
    max_grad_norm: float | None
    sample_rate: float
    batch_size: int
    steps: int
    delta: float | None
    accountant: str | None
    n_phases: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the config)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "config"}

    @property
    def train(self) -> TrainRecipe:
        """The :class:`~training.dp.recipe.TrainRecipe` of one reference model (secure mode off: reference models
        are the auditor's, seeded and reproducible)."""
        cfg = self.config
        privacy = cfg.privacy.model_copy(update={"enabled": self.dp, "secure_mode": False,
                                                 "max_grad_norm": self.max_grad_norm or cfg.privacy.max_grad_norm})
        return TrainRecipe.from_privacy(privacy=privacy, optim=cfg.optim, steps=self.steps, batch_size=self.batch_size,
                                        noise_multiplier=self.noise_multiplier,
                                        physical_batch_size=cfg.training.physical_batch_size, training=cfg.training)


def _pool_phase(phases: list[PhaseInfo]) -> PhaseInfo:
    """The phase that trained on the audited pool: the last one (standard: the only one)."""
    return phases[-1]


def shadow_recipe(*, config: TrainConfig, manifest: Manifest) -> ShadowRecipe:
    """The recipe reference models of this target follow (see the module docstring).

    Raises:
        UserError: the manifest records no training phase (nothing to copy).
    """
    phases = list(manifest.privacy.phases)
    if not phases:
        raise UserError(f"the manifest of run {manifest.run_name!r} records no training phase, so its recipe "
                        f"cannot be copied; retrain it with 'audit train'")
    phase = _pool_phase(phases)
    n_pool = manifest.data.pool_size
    q = float(phase.sample_rate) if phase.sample_rate is not None else \
        config.training.batch_size / max(1, manifest.data.membership.n_members)
    dp = bool(phase.dp)
    return ShadowRecipe(
        config=config, hash=recipe_hash(config), dp=dp,
        noise_multiplier=float(phase.noise_multiplier) if dp and phase.noise_multiplier is not None else None,
        max_grad_norm=float(phase.max_grad_norm) if dp and phase.max_grad_norm is not None else None,
        sample_rate=q, batch_size=max(1, round(q * n_pool / 2)), steps=int(phase.steps),
        delta=manifest.privacy.delta if dp else None, accountant=manifest.privacy.accountant if dp else None,
        n_phases=len(phases))


def shadow_config(recipe: ShadowRecipe, *, name: str, seed: int, output_dir: str) -> TrainConfig:
    """The training config of one reference model: the target's, with sigma, steps and batch size pinned.

    For a single-phase recipe sigma is the target's (``privacy.noise_multiplier``; no re-calibration to a
    target epsilon on the smaller training set), ``training.steps`` the target's step count and
    ``training.batch_size`` the reference model's expected batch. Multi-phase recipes keep the target's
    settings (their trainer derives each phase itself).

    >>> r = ShadowRecipe(config=TrainConfig(), hash="0" * 64, dp=True, noise_multiplier=1.5, max_grad_norm=1.0,
    ...                  sample_rate=0.1, batch_size=50, steps=100, delta=1e-4, accountant="prv", n_phases=1)
    >>> c = shadow_config(r, name="s0", seed=7, output_dir="out")
    >>> c.privacy.noise_multiplier, c.privacy.target_epsilon, c.training.steps, c.training.seed
    (1.5, None, 100, 7)
    """
    data = copy.deepcopy(recipe.config.model_dump(mode="json"))
    data.update(name=name, output_dir=output_dir)
    data["training"].update(seed=int(seed), progress=False)
    data["privacy"].update(secure_mode=False)  # a reference model is the auditor's: seeded, reproducible
    if recipe.n_phases == 1:
        data["training"].update(steps=recipe.steps, epochs=None, batch_size=recipe.batch_size)
        if recipe.dp and recipe.noise_multiplier is not None:
            data["privacy"].update(noise_multiplier=recipe.noise_multiplier, target_epsilon=None,
                                   delta=recipe.delta)
    return TrainConfig.model_validate(data)


def _build(model_cfg: ModelConfig, num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    return build_model(model_cfg, num_classes=num_classes, input_shape=input_shape).module


def model_factory(model_cfg: ModelConfig, *, num_classes: int,
                  input_shape: tuple[int, int, int]) -> Callable[[], nn.Module]:
    """A picklable zero-argument factory of the target's architecture (for batched and process training)."""
    return functools.partial(_build, model_cfg, int(num_classes), tuple(int(s) for s in input_shape))


BATCHED_ARCHS = ("small_cnn", "mlp")


def batched_unsupported(recipe: ShadowRecipe, *, num_classes: int, input_shape: tuple[int, int, int]) -> str | None:
    """Why the batched (torch.func) trainer cannot follow this recipe, or None when it can.

    The batched trainer (:mod:`training.dp.batched`) implements single-phase DP-SGD with flat clipping (or plain
    SGD/Adam/AdamW) for the small architectures in :data:`BATCHED_ARCHS` without BatchNorm or dropout;
    anything else goes to the regular trainer.
    """
    cfg = recipe.config
    if cfg.training.recipe != "standard" or recipe.n_phases != 1:
        return f"training.recipe is {cfg.training.recipe!r} ({recipe.n_phases} phases); only 'standard' is batched"
    if recipe.dp and cfg.privacy.clipping != "flat":
        return f"privacy.clipping is {cfg.privacy.clipping!r}; batched training clips flat only"
    if recipe.dp and recipe.noise_multiplier is None:
        return "the manifest records no noise multiplier"
    if cfg.training.gradient_canaries.count:
        return "gradient canaries are inserted by the regular trainer only"
    if cfg.model.arch not in BATCHED_ARCHS:
        return f"model.arch {cfg.model.arch!r} is not a batched architecture ({', '.join(BATCHED_ARCHS)})"
    try:
        check_model(build_model(cfg.model, num_classes=num_classes, input_shape=input_shape).module)
    except ConfigError as exc:
        return str(exc)
    return None
