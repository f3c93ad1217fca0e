"""RMIA: Zarifzadeh, Liu, Lee, Shokri, "Low-Cost High-Power Membership Inference Attacks" (ICML 2024).

For a queried example ``x`` and population samples ``z`` (known non-members of the target)::

    ratio_x = Pr(x | theta) / Pr(x),    score(x) = fraction of z with ratio_x / ratio_z > gamma

- ``Pr(x | theta) = p_y(x) = sigmoid(phi)``, averaged over the augmented queries;
- ``Pr(x)`` is the same probability averaged over reference models: online over all references (about half
  IN, half OUT); offline over the OUT references only, corrected by the paper's linear approximation
  ``Pr(x) = ((1 + a) Pr_OUT(x) + (1 - a)) / 2`` (parameter ``a``; ``a = 1`` uses ``Pr_OUT`` as is).

Everything is computed in log space (log-sigmoid, log-mean-exp), so probabilities far below 1e-300 keep
their ratios. The pairwise comparison is vectorised with one sort of ``log ratio_z`` and a
``searchsorted`` (``O((n + m) log m)``), never an ``n x m`` matrix. Higher score = member.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import special

from attacks.metrics import auc
from attacks.registry import Attack, AttackInputs, leave_one_out, register_attack
from attacks.signals import log_prob_from_phi
from training.errors import UserError

__all__ = ["RmiaOnline", "RmiaOffline", "log_mean_prob", "pairwise_fraction_above", "tune_offline_a"]


def log_mean_prob(phi: np.ndarray) -> np.ndarray:
    """``log mean_a sigmoid(phi[..., a])``: log of the true-label probability averaged over augmentations.

    3-D inputs (reference models first) are processed one model at a time to bound temporary memory.

    >>> float(np.exp(log_mean_prob(np.array([[0.0, 0.0]])))[0])
    0.5
    """
    if phi.ndim == 3:
        return np.stack([log_mean_prob(p) for p in phi]) if len(phi) else np.empty(phi.shape[:2])
    return special.logsumexp(log_prob_from_phi(phi), axis=-1) - math.log(phi.shape[-1])


def pairwise_fraction_above(log_ratio_x: np.ndarray, log_ratio_z: np.ndarray, *, log_gamma: float) -> np.ndarray:
    """For each x: the fraction of z with ``log_ratio_x - log_ratio_z > log_gamma``.

    >>> pairwise_fraction_above(np.array([0.0, 2.5]), np.array([0.0, 1.0, 2.0]), log_gamma=0.0).tolist()
    [0.0, 1.0]
    """
    z = np.sort(np.asarray(log_ratio_z, dtype=np.float64))
    if z.size == 0:
        raise ValueError("log_ratio_z must not be empty")
    return np.searchsorted(z, log_ratio_x - log_gamma, side="left") / z.size


def _log_mean_masked(logp: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Log of the mean of ``exp(logp)`` over axis 0 where ``mask``; ``(-inf, 0)`` where nothing is selected."""
    count = mask.sum(axis=0)
    with np.errstate(divide="ignore"):
        s = special.logsumexp(np.where(mask, logp, -np.inf), axis=0)
        return s - np.log(np.maximum(count, 1)), count


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Rmia(Attack):
    """Shared parameters of online and offline RMIA.

    Attributes:
        gamma: likelihood-ratio threshold ``> 0`` for the pairwise comparison (the paper's default is 1).
        n_population: use at most this many population samples ``z`` (a seeded random subset); None: all.
        seed: seed of that subset.
    """

    gamma: float = 1.0
    n_population: int | None = None
    seed: int = 0

    needs_reference = True

    def __post_init__(self) -> None:
        if not isinstance(self.gamma, (int, float)) or not math.isfinite(self.gamma) or self.gamma <= 0:
            raise ValueError(f"gamma must be a finite number > 0; got {self.gamma!r}")
        if self.n_population is not None and (isinstance(self.n_population, bool) or
                                              not isinstance(self.n_population, int) or self.n_population < 1):
            raise ValueError(f"n_population must be None or an integer >= 1; got {self.n_population!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer; got {self.seed!r}")

    @abc.abstractmethod
    def _log_px(self, ref_logp: np.ndarray, keep: np.ndarray | None) -> tuple[np.ndarray, int]:
        """``log Pr(x)`` from ``(K, n)`` per-reference log probabilities; returns it and a fallback count."""

    def score_with_info(self, inputs: AttackInputs) -> tuple[np.ndarray, dict[str, Any]]:
        self._check(inputs)
        log_px, fallback_x = self._log_px(log_mean_prob(inputs.reference), inputs.reference_in)
        log_ratio_x = log_mean_prob(inputs.target) - log_px
        if inputs.pop_target is None:
            source, log_ratio_z, fallback_z = "queried", log_ratio_x, 0
        elif inputs.pop_reference is None:
            raise UserError("RMIA needs the reference models' signals on the population (pop_reference) "
                            "whenever pop_target is given")
        else:
            log_pz, fallback_z = self._log_px(log_mean_prob(inputs.pop_reference), inputs.pop_reference_in)
            source, log_ratio_z = "pop_target", log_mean_prob(inputs.pop_target) - log_pz
        m_all = log_ratio_z.shape[0]
        if self.n_population is not None and m_all > self.n_population:
            pick = np.sort(np.random.default_rng(self.seed).choice(m_all, self.n_population, replace=False))
            log_ratio_z = log_ratio_z[pick]
        scores = pairwise_fraction_above(log_ratio_x, log_ratio_z, log_gamma=math.log(self.gamma))
        return scores, {"population": source, "n_population": int(log_ratio_z.shape[0]),
                        "n_fallback": int(fallback_x), "n_fallback_population": int(fallback_z)}


@register_attack("rmia_online")
@dataclasses.dataclass(frozen=True, kw_only=True)
class RmiaOnline(_Rmia):
    """Online RMIA: ``Pr(x)`` is the mean over ALL references (keep masks are not needed, but about half of
    the references should have trained on each example). Higher = member.

    Without population signals, the queried examples themselves serve as ``z`` (``info["population"]``).

    >>> rng = np.random.default_rng(0)
    >>> keep = rng.random((16, 300)) < 0.5
    >>> ref = rng.normal(size=(16, 300, 1)) + 3.0 * keep[..., None]
    >>> member = rng.random(300) < 0.5
    >>> target = rng.normal(size=(300, 1)) + 3.0 * member[:, None]
    >>> s = RmiaOnline().score(AttackInputs(target=target, reference=ref))
    >>> bool(s[member].mean() > s[~member].mean())
    True
    """

    online = True

    def _log_px(self, ref_logp: np.ndarray, keep: np.ndarray | None) -> tuple[np.ndarray, int]:
        return special.logsumexp(ref_logp, axis=0) - math.log(ref_logp.shape[0]), 0


@register_attack("rmia_offline")
@dataclasses.dataclass(frozen=True, kw_only=True)
class RmiaOffline(_Rmia):
    """Offline RMIA: ``Pr(x) = ((1 + a) Pr_OUT(x) + (1 - a)) / 2`` from OUT references. Higher = member.

    ``Pr_OUT`` averages the references where the keep mask is False (every reference when masks are
    unknown). An example with no OUT reference uses the mean over all its references as ``Pr(x)``;
    ``info["n_fallback"]`` counts them. Tune ``a`` with :func:`tune_offline_a`.

    Attributes:
        a: the offline approximation coefficient in ``[0, 1]`` (the privacy-meter default is 0.3).
    """

    a: float = 0.3

    online = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.a, (int, float)) or not 0.0 <= self.a <= 1.0:
            raise ValueError(f"a must be a number in [0, 1]; got {self.a!r}")

    def _log_px(self, ref_logp: np.ndarray, keep: np.ndarray | None) -> tuple[np.ndarray, int]:
        out = np.ones(ref_logp.shape, dtype=bool) if keep is None else ~keep
        log_out, count = _log_mean_masked(ref_logp, out)
        a = float(self.a)
        if a < 1.0:
            log_px = np.logaddexp(math.log((1.0 + a) / 2.0) + log_out, math.log((1.0 - a) / 2.0))
        else:
            log_px = log_out
        empty = count == 0
        if empty.any():
            log_all = special.logsumexp(ref_logp, axis=0) - math.log(ref_logp.shape[0])
            log_px = np.where(empty, log_all, log_px)
        return log_px, int(empty.sum())


def tune_offline_a(
    phi_refs: np.ndarray,
    keep: np.ndarray,
    *,
    grid: Sequence[float] = tuple(np.round(np.linspace(0.0, 1.0, 11), 2)),
    pop_phi: np.ndarray | None = None,
    targets: Sequence[int] = (0,),
    gamma: float = 1.0,
) -> tuple[float, dict[float, float]]:
    """Choose offline RMIA's ``a`` by attacking reference models with the other references (paper, Sec. 4).

    Only reference models are attacked, so the audited target is never used for tuning.

    Args:
        phi_refs: ``(K, n, A)`` reference signals on the pool.
        keep: ``(K, n)`` keep masks.
        grid: candidate values of ``a`` in [0, 1].
        pop_phi: optional ``(K, m, A)`` reference signals on population samples.
        targets: which reference models to attack in turn; AUCs are averaged.
        gamma: RMIA's ``gamma``.

    Returns:
        ``(best_a, {a: mean AUC})``; ties go to the smaller ``a``.
    """
    if not grid:
        raise ValueError("grid must contain at least one value of a")
    aucs: dict[float, float] = {}
    for a in grid:
        results = leave_one_out(RmiaOffline(a=float(a), gamma=gamma), phi_refs, keep, pop_phi=pop_phi,
                                targets=targets)
        aucs[float(a)] = float(np.mean([auc(r.scores, r.membership) for r in results]))
    best = max(aucs, key=lambda k: (aucs[k], -k))
    return best, aucs
