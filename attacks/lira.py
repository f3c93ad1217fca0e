"""LiRA: the likelihood-ratio attack of Carlini et al., "Membership Inference Attacks From First
Principles" (IEEE S&P 2022), online and offline, with per-example or fixed (pooled) variance.

For each example and augmentation, the scaled logits ``phi`` of reference models trained with (IN) and
without (OUT) the example are modelled as Gaussians ``N(mu_in, var_in)`` and ``N(mu_out, var_out)``.

- Online (Algorithm 1): score = mean over augmentations of
  ``log N(phi; mu_in, var_in) - log N(phi; mu_out, var_out)``, the log likelihood ratio of the paper
  (the reference code averages the per-augmentation log ratios in the same way).
- Offline (Sec. IV-C): only OUT references. The paper's one-sided test rejects "non-member" when
  ``phi`` is large under ``N(mu_out, var_out)``: with ``t = (phi - mu_out) / sd_out`` the one-sided p-value is
  ``p = 1 - Phi(t)``. ``statistic="neg_log_pvalue"`` (default) scores ``-log p = -log Phi(-t)``;
  ``statistic="log_cdf"`` scores ``log Phi(t)`` (the log of the paper's ``Lambda``). Both increase with ``t``;
  they rank identically for one query and differ only in how augmentations are averaged: ``-log p`` keeps
  resolution in the upper tail where members are, ``log Phi(t)`` saturates at 0 there.

Estimators (documented choices, tested against naive loops):

- location: per-example ``median`` (default: the LiRA paper's released code) or ``mean`` (the paper's
  Algorithm 1); ``attack.json`` records which under the attack's ``params``;
- per-example variance: unbiased (``ddof=1``) over that example's IN (or OUT) references;
- ``fix_variance=True``: one variance per augmentation and side, the pooled within-example variance
  ``sum_i sum_k (phi_ik - mu_i)^2 / sum_i (n_i - 1)`` over examples with ``n_i >= 2`` references on that side.
  (The public reference code instead takes the spread around the grand mean, which adds the between-example
  variance of the means, and its fixed-variance branch reuses the IN spread for OUT; we do neither.)
- fallback: an example with fewer than ``min_refs`` references on a side uses that side's global estimates
  (mean over every reference signal on that side, variance around that global mean); ``info`` counts them.

Every score is "higher = member".
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np
from scipy import special

from attacks.registry import Attack, AttackInputs, register_attack
from foundation.errors import UserError

__all__ = ["GaussianFit", "fit_gaussians", "gaussian_logpdf", "LiraOnline", "LiraOffline"]

MIN_VARIANCE = 1e-12
"""Variances are floored here, so identical reference signals cannot give an infinite log density."""

_CHUNK_ELEMENTS = 1 << 22


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class GaussianFit:
    """Per-example Gaussian model of reference signals on one side (IN or OUT).

    Attributes:
        mu: ``(n, A)`` location per example and augmentation.
        var: ``(n, A)`` variance (floored at :data:`MIN_VARIANCE`).
        count: ``(n,)`` number of references on this side per example.
        n_fallback: examples with ``count < min_refs`` that use the global estimates.
    """

    mu: np.ndarray
    var: np.ndarray
    count: np.ndarray
    n_fallback: int


def gaussian_logpdf(x: np.ndarray, mu: np.ndarray, var: np.ndarray) -> np.ndarray:
    """``log N(x; mu, var)`` elementwise.

    >>> round(float(gaussian_logpdf(np.array(0.0), np.array(0.0), np.array(1.0))), 6)
    -0.918939
    """
    return -0.5 * (np.log(2.0 * np.pi * var) + (x - mu) ** 2 / var)


def fit_gaussians(
    values: np.ndarray,
    mask: np.ndarray,
    *,
    fix_variance: bool = False,
    location: Literal["mean", "median"] = "mean",
    min_refs: int = 2,
) -> GaussianFit:
    """Fit ``N(mu_i, var_i)`` per example ``i`` (and augmentation) to the references selected by ``mask``.

    Args:
        values: ``(K, n, A)`` reference signals.
        mask: ``(K, n)`` bool: which references belong to this side for each example.
        fix_variance: use one pooled within-example variance per augmentation (see module docstring).
        location: ``"mean"`` or ``"median"`` of each example's references.
        min_refs: examples with fewer references on this side use the global estimates (``>= 2``).

    Returns:
        A :class:`GaussianFit`.

    Raises:
        UserError: if the mask selects fewer than 2 signals in total (nothing to estimate from).
        ValueError: on a bad ``location`` or ``min_refs``.

    >>> vals = np.array([[[0.0]], [[2.0]], [[4.0]]])   # K=3 references, n=1 example, A=1
    >>> fit = fit_gaussians(vals, np.ones((3, 1), dtype=bool))
    >>> float(fit.mu[0, 0]), float(fit.var[0, 0])
    (2.0, 4.0)
    """
    if location not in ("mean", "median"):
        raise ValueError(f"location must be 'mean' or 'median'; got {location!r}")
    if isinstance(min_refs, bool) or not isinstance(min_refs, (int, np.integer)) or min_refs < 2:
        raise ValueError(f"min_refs must be an integer >= 2; got {min_refs!r}")
    k, n, a = values.shape
    count = mask.sum(axis=0)
    total = int(count.sum())
    if total < 2:
        raise UserError(f"LiRA needs at least 2 reference signals on each side (IN/OUT); got {total}; "
                        f"train more reference models")
    mu = np.empty((n, a))
    mean = np.empty((n, a))
    deviance = np.empty((n, a))          # sum_k (phi - mean_i)^2 over the side's references
    step = max(1, _CHUNK_ELEMENTS // max(1, k * a))
    for s in range(0, n, step):
        sl = slice(s, s + step)
        v = values[:, sl].astype(np.float64, copy=False)
        w = mask[:, sl].astype(np.float64)
        mean[sl] = np.einsum("kn,kna->na", w, v) / np.maximum(count[sl], 1)[:, None]
        deviance[sl] = np.einsum("kn,kna->na", w, (v - mean[sl]) ** 2)
        if location == "median":
            ok = count[sl] > 0
            med = np.full((len(ok), a), np.nan)
            med[ok] = np.nanmedian(np.where(mask[:, sl, None], v, np.nan)[:, ok], axis=0)
            mu[sl] = med
    if location == "mean":
        mu = mean
    gmean = (count[:, None] * mean).sum(axis=0) / total
    # total spread around the global mean = within-example deviance + between-example part
    gdev = deviance.sum(axis=0) + (count[:, None] * (mean - gmean) ** 2).sum(axis=0)
    gvar = gdev / (total - 1)
    multi = count >= 2
    if fix_variance and multi.any():
        pooled = deviance[multi].sum(axis=0) / (count[multi] - 1).sum()
        var = np.broadcast_to(pooled, (n, a)).copy()
    elif fix_variance:
        var = np.broadcast_to(gvar, (n, a)).copy()
    else:
        var = deviance / np.maximum(count - 1, 1)[:, None]
    ok = count >= min_refs
    mu = np.where(ok[:, None], mu, gmean)
    var = np.where(ok[:, None], var, gvar)
    return GaussianFit(mu=mu, var=np.maximum(var, MIN_VARIANCE), count=count, n_fallback=int((~ok).sum()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Lira(Attack):
    """Shared parameters of online and offline LiRA."""

    fix_variance: bool = False
    location: Literal["median", "mean"] = "median"
    min_refs: int = 2

    needs_reference = True

    def __post_init__(self) -> None:
        if not isinstance(self.fix_variance, bool):
            raise ValueError(f"fix_variance must be a bool; got {self.fix_variance!r}")
        if self.location not in ("mean", "median"):
            raise ValueError(f"location must be 'mean' or 'median'; got {self.location!r}")
        if isinstance(self.min_refs, bool) or not isinstance(self.min_refs, int) or self.min_refs < 2:
            raise ValueError(f"min_refs must be an integer >= 2; got {self.min_refs!r}")

    def _fit(self, inputs: AttackInputs, mask: np.ndarray) -> GaussianFit:
        return fit_gaussians(inputs.reference, mask, fix_variance=self.fix_variance,
                             location=self.location, min_refs=self.min_refs)


@register_attack("lira_online")
@dataclasses.dataclass(frozen=True, kw_only=True)
class LiraOnline(_Lira):
    """Online LiRA: mean over augmentations of ``log N(phi; IN) - log N(phi; OUT)``; higher = member.

    Needs reference models with keep masks, about half of them IN for each example.

    >>> rng = np.random.default_rng(0)
    >>> keep = rng.random((64, 200)) < 0.5
    >>> ref = rng.normal(size=(64, 200, 1)) + 2.0 * keep[..., None]
    >>> member = rng.random(200) < 0.5
    >>> target = rng.normal(size=(200, 1)) + 2.0 * member[:, None]
    >>> s = LiraOnline().score(AttackInputs(target=target, reference=ref, reference_in=keep))
    >>> bool(s[member].mean() > s[~member].mean())
    True
    """

    online = True
    needs_keep_masks = True

    def score_with_info(self, inputs: AttackInputs) -> tuple[np.ndarray, dict[str, Any]]:
        self._check(inputs)
        fin = self._fit(inputs, inputs.reference_in)
        fout = self._fit(inputs, ~inputs.reference_in)
        x = inputs.target
        llr = gaussian_logpdf(x, fin.mu, fin.var) - gaussian_logpdf(x, fout.mu, fout.var)
        return llr.mean(axis=1), {"n_fallback_in": fin.n_fallback, "n_fallback_out": fout.n_fallback,
                                  "min_in_references": int(fin.count.min()),
                                  "min_out_references": int(fout.count.min())}


@register_attack("lira_offline")
@dataclasses.dataclass(frozen=True, kw_only=True)
class LiraOffline(_Lira):
    """Offline LiRA: one-sided test of ``phi`` against the OUT Gaussian; higher = member.

    Uses only OUT references (every reference when keep masks are unknown). ``statistic`` is
    ``"neg_log_pvalue"`` (``-log(1 - Phi(t))``, default) or ``"log_cdf"`` (``log Phi(t)``), averaged over
    augmentations, with ``t = (phi - mu_out) / sd_out``.

    >>> ref = np.array([[[0.0]], [[1.0]], [[-1.0]]])        # K=3 OUT references, one example
    >>> s = [LiraOffline().score(AttackInputs(target=np.array([[v]]), reference=ref))[0] for v in (0.0, 3.0)]
    >>> round(float(s[0]), 4), bool(s[1] > s[0])          # -log(1/2) at the OUT mean
    (0.6931, True)
    """

    statistic: Literal["neg_log_pvalue", "log_cdf"] = "neg_log_pvalue"

    online = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.statistic not in ("neg_log_pvalue", "log_cdf"):
            raise ValueError(f"statistic must be 'neg_log_pvalue' or 'log_cdf'; got {self.statistic!r}")

    def score_with_info(self, inputs: AttackInputs) -> tuple[np.ndarray, dict[str, Any]]:
        self._check(inputs)
        fout = self._fit(inputs, inputs.out_mask())
        t = (inputs.target - fout.mu) / np.sqrt(fout.var)
        per_aug = -special.log_ndtr(-t) if self.statistic == "neg_log_pvalue" else special.log_ndtr(t)
        return per_aug.mean(axis=1), {"n_fallback_out": fout.n_fallback,
                                      "min_out_references": int(fout.count.min())}
