"""Audit the mechanism a training config describes, before (or without) training it.

``audit mechanism CONFIG`` answers "is the DP-SGD this config will run the mechanism its claim assumes?" without
a finished run. The claim is the one ``audit train CONFIG`` would write into its manifest: the pool and the
membership draw give the number of private examples n (:func:`training.pool.build_pool`,
:func:`training.pool.membership_mask`, the same calls as training), hence q = ``training.batch_size`` / n, T
(``training.steps``, or ``training.epochs`` passes), δ (``privacy.delta`` or the default for n), σ
(``privacy.noise_multiplier`` or calibrated to ``privacy.target_epsilon`` by the configured accountant) and ε (that
accountant at σ, q, T, δ). The project's engine then runs on the Dirac-canary probe
(:mod:`audit.mechanism.engine_target`) with the config's clipping norm and style, ``grad_sample_mode``, noise
and batch sampler, and the trials are judged against that claimed (ε, δ) as for a finished run.

What is not the config's: the model (the probe: what is audited is the optimizer step, not the network) and the
optimizer after the privatised gradient (SGD at learning rate 1, so the update can be read; whatever the
config's optimizer does with the noisy gradient is post-processing and cannot change the guarantee).

Only the ``standard`` recipe has its DP phase fixed by the config alone (``continual_pretrain`` decides its switch
while training; ``finetune`` splits its budget over phases built from a checkpoint): those are refused in one
line, to be audited after training with ``audit mechanism RUN``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from audit.mechanism.api import audit_mechanism
from audit.mechanism.result import MechanismResult
from foundation.errors import ConfigError, UserError

__all__ = ["ConfigClaim", "config_claim", "load_train_config", "audit_config_mechanism", "default_out"]

MEMBERS_PER_RUN = 1000


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConfigClaim:
    """The DP phase and claim ``audit train`` would make from a config (see the module docstring)."""

    name: str
    n: int
    batch_size: int
    sample_rate: float
    steps: int
    noise_multiplier: float
    delta: float
    epsilon: float
    accountant: str
    max_grad_norm: float
    clipping: str
    grad_sample_mode: str
    sampling: str

    @property
    def members_per_run(self) -> int:
        """Member canaries per probe run: :data:`MEMBERS_PER_RUN`, or n when n is smaller. The sampler draws from
        all n examples at the config's batch size (the canaries are some of them), so its batches are exactly
        the config's."""
        return min(MEMBERS_PER_RUN, self.n)


def config_claim(cfg) -> ConfigClaim:
    """The claim of ``cfg`` (a validated :class:`~training.config.TrainConfig`), computed as training computes it.

    Raises:
        UserError: privacy is off, the recipe's DP phases are not fixed by the config, the batch is larger than the
            members, or the data cannot be loaded (one line each).
    """
    from training.accounting import DPPhase, default_delta, epsilon_for
    from training.pool import build_pool, membership_mask
    from training.recipes.common import calibrate_sigma

    pc, tc = cfg.privacy, cfg.training
    if not pc.enabled:
        raise ConfigError("privacy.enabled is false: the config makes no DP claim, so there is no mechanism to audit")
    if tc.recipe != "standard":
        raise ConfigError(f"training.recipe: {tc.recipe} fixes its DP phases while training (a switch step or a "
                          "budget split over phases): train it, then audit the run with audit mechanism RUN")
    pool = build_pool(cfg)
    mask, _ = membership_mask(cfg, pool)
    n = int(mask.sum())
    if n == 0:
        raise UserError("the membership draw selected no training examples; enlarge the pool")
    if tc.batch_size > n:
        raise ConfigError(f"training.batch_size={tc.batch_size} is larger than the {n} training examples; lower it "
                          "or enlarge the pool (data.pool_size / data.audit_split)")
    steps = tc.steps if tc.steps is not None else max(1, int(math.ceil(tc.epochs * n / tc.batch_size)))
    q = tc.batch_size / n
    delta = pc.delta if pc.delta is not None else default_delta(n)
    sigma = calibrate_sigma(cfg, sample_rate=q, steps=steps, delta=delta)
    eps = epsilon_for(phases=[DPPhase(sigma, q, steps)], delta=delta, accountant=pc.accountant)
    return ConfigClaim(name=cfg.name, n=n, batch_size=int(tc.batch_size), sample_rate=q, steps=int(steps),
                       noise_multiplier=float(sigma), delta=float(delta), epsilon=float(eps), accountant=pc.accountant,
                       max_grad_norm=float(pc.max_grad_norm), clipping=pc.clipping,
                       grad_sample_mode=pc.grad_sample_mode, sampling=pc.sampling)


def load_train_config(path: str | Path, *, overrides=(), variant: str | None = None):
    """The :class:`~training.config.TrainConfig` of an ``audit run`` or ``audit train`` YAML file, as
    ``audit mechanism CONFIG`` reads it (``--set`` overrides, then the ``--variant`` of a config that defines
    several).

    Raises:
        ConfigError: the file is missing or invalid, or the variant is missing or unknown (one line).
    """
    from audit.config import load_run_config, select_variant

    return select_variant(load_run_config(path, overrides), variant).train_config()


def default_out(cfg) -> Path:
    """Where ``audit mechanism CONFIG`` writes ``mechanism.json`` by default: ``<output_dir>/<name>-mechanism`` (not
    the run directory itself, which ``audit train`` will fill)."""
    return Path(cfg.output_dir) / f"{cfg.name}-mechanism"


def audit_config_mechanism(cfg, *, trials: int = 20_000, alpha: float = 0.05, seed: int = 0,
                           out: str | Path | None = None, overrides=(), variant: str | None = None
                           ) -> tuple[ConfigClaim, MechanismResult]:
    """Audit the engine as ``cfg`` configures it against the claim ``audit train`` would make (the library
    function of ``audit mechanism CONFIG``; ``audit.audit_config_mechanism``).

    Args:
        cfg: the path of an ``audit run`` / ``audit train`` YAML file (read with ``overrides`` and ``variant`` as
            :func:`load_train_config` reads it), or a validated :class:`~training.config.TrainConfig` (an
            ``audit run`` config's ``train_config()``).
        trials: canary trials in all (half members); whole probe runs of twice :attr:`ConfigClaim.members_per_run`.
        alpha: significance level of the ε lower bound.
        seed: seeds the probe runs.
        out: directory to write ``mechanism.json`` into (created), or None (the command's default is
            :func:`default_out`).
        overrides, variant: with a path, ``--set`` strings (or a mapping) and the variant to audit.

    Returns:
        The :class:`ConfigClaim` and the :class:`~audit.mechanism.result.MechanismResult`.

    Raises:
        UserError: as :func:`load_train_config` and :func:`config_claim`, or settings the engine refuses (one
            line, nothing written).
    """
    if isinstance(cfg, (str, os.PathLike)):
        cfg = load_train_config(cfg, overrides=overrides, variant=variant)
    elif overrides or variant is not None:
        raise UserError("overrides and variant apply to a config file path, not to a TrainConfig")
    claim = config_claim(cfg)
    m = 2 * claim.members_per_run
    kwargs = dict(noise_multiplier=claim.noise_multiplier, sample_rate=claim.sample_rate, steps=claim.steps,
                  delta=claim.delta, max_grad_norm=claim.max_grad_norm, clipping=claim.clipping,
                  grad_sample_mode=claim.grad_sample_mode, trials=max(int(trials), m), canaries_per_run=m,
                  alpha=alpha, seed=seed, accountant=claim.accountant, claimed_epsilon=claim.epsilon,
                  sampling=claim.sampling, population=claim.n)
    result = audit_mechanism(**kwargs)  # nothing is written until the audit has succeeded
    if out is not None:
        from audit.mechanism.result import write_mechanism

        Path(out).mkdir(parents=True, exist_ok=True)
        write_mechanism(out, result)
    return claim, result
