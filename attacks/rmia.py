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

Ties. With ``m`` population samples the fraction takes only ``m + 1`` values, and every example whose ratio
exceeds every ``ratio_z`` gets 1: on a strong attack hundreds of members and non-members share the top score,
and the ROC's first step (a diagonal through that tie group) can skip the 1 % and 0.1 % FPR levels entirely.
For a fixed population the fraction is a non-decreasing step function of ``log ratio_x`` alone, so ordering
tied examples by ``log ratio_x`` is the ranking the same pairwise rule gives with a denser population.
``ties="likelihood_ratio"`` (default) does exactly that: ``score = (count + h) / (m + 1)`` with ``count`` the
number of ``z`` below and ``h`` in ``(0, 1)`` strictly increasing in ``log ratio_x`` (its dense rank), so
scores stay in ``(0, 1)``, keep the paper's order between different counts and break every tie that the
ratios themselves do not share; ``ties="keep"`` returns the paper's fraction as is. ``info`` reports the tie
groups before (and after) breaking.

Offline ``a``: ``a="auto"`` (default) chooses ``a`` on the reference models alone, as the paper (Sec. 4)
and Privacy Meter do: the first reference model is attacked as a pseudo-target by the other references
(with the same population), for each ``a`` in ``0, 0.1, ..., 1``, and the ``a`` with the highest AUC is
used (ties: the smaller ``a``). The audited target's membership is never looked at; ``info`` records the
chosen value, the grid's AUCs and what they were measured on.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from scipy import special

from attacks.metrics import auc
from attacks.registry import Attack, AttackInputs, register_attack
from attacks.signals import log_prob_from_phi
from foundation.errors import UserError

__all__ = ["RmiaOnline", "RmiaOffline", "log_mean_prob", "pairwise_fraction_above", "break_ties", "tie_summary",
           "tune_offline_a", "pseudo_target_inputs", "A_GRID"]

#: the grid of offline ``a`` values searched when ``a="auto"`` (the paper's and Privacy Meter's)
A_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))


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


def break_ties(count: np.ndarray, log_ratio_x: np.ndarray, m: int) -> np.ndarray:
    """``(count + h) / (m + 1)`` with ``h`` in ``(0, 1)`` the dense rank of ``log_ratio_x`` scaled below 1.

    ``count`` must be non-decreasing in ``log_ratio_x`` (the pairwise count is), so the result orders
    different counts as ``count`` does and tied counts by ``log_ratio_x``; equal ratios stay tied.

    >>> break_ties(np.array([2, 2, 0]), np.array([5.0, 3.0, -1.0]), 2).round(3).tolist()
    [0.917, 0.833, 0.083]
    """
    values, dense = np.unique(np.asarray(log_ratio_x, dtype=np.float64), return_inverse=True)
    h = (dense.reshape(-1) + 1.0) / (values.size + 1.0)
    return (np.asarray(count, dtype=np.float64) + h) / (m + 1.0)


def tie_summary(scores: np.ndarray) -> dict[str, int]:
    """How many scores share a value: ``tied`` (examples in a group of two or more), ``largest`` group,
    ``top`` (examples sharing the highest score).

    >>> tie_summary(np.array([1.0, 1.0, 0.5, 0.5, 0.5, 0.2]))
    {'tied': 5, 'largest': 3, 'top': 2}
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0:
        return {"tied": 0, "largest": 0, "top": 0}
    _, counts = np.unique(s, return_counts=True)
    return {"tied": int(counts[counts > 1].sum()), "largest": int(counts.max()), "top": int(counts[-1])}


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
        ties: ``"likelihood_ratio"`` breaks ties between equal fractions by ``log ratio_x`` (module
            docstring); ``"keep"`` returns the paper's fraction.
    """

    gamma: float = 1.0
    n_population: int | None = None
    seed: int = 0
    ties: Literal["likelihood_ratio", "keep"] = "likelihood_ratio"

    needs_reference = True

    def __post_init__(self) -> None:
        if not isinstance(self.gamma, (int, float)) or not math.isfinite(self.gamma) or self.gamma <= 0:
            raise ValueError(f"gamma must be a finite number > 0; got {self.gamma!r}")
        if self.n_population is not None and (isinstance(self.n_population, bool) or
                                              not isinstance(self.n_population, int) or self.n_population < 1):
            raise ValueError(f"n_population must be None or an integer >= 1; got {self.n_population!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer; got {self.seed!r}")
        if self.ties not in ("likelihood_ratio", "keep"):
            raise ValueError(f"ties must be 'likelihood_ratio' or 'keep'; got {self.ties!r}")

    @abc.abstractmethod
    def _log_px(self, ref_logp: np.ndarray, keep: np.ndarray | None) -> tuple[np.ndarray, int]:
        """``log Pr(x)`` from ``(K, n)`` per-reference log probabilities; returns it and a fallback count."""

    def _population(self, inputs: AttackInputs, log_ratio_x: np.ndarray) -> tuple[str, np.ndarray, int]:
        if inputs.pop_target is None:
            return "queried", log_ratio_x, 0
        if inputs.pop_reference is None:
            raise UserError("RMIA needs the reference models' signals on the population (pop_reference) "
                            "whenever pop_target is given")
        log_pz, fallback_z = self._log_px(log_mean_prob(inputs.pop_reference), inputs.pop_reference_in)
        return "pop_target", log_mean_prob(inputs.pop_target) - log_pz, fallback_z

    def score_with_info(self, inputs: AttackInputs) -> tuple[np.ndarray, dict[str, Any]]:
        self._check(inputs)
        log_px, fallback_x = self._log_px(log_mean_prob(inputs.reference), inputs.reference_in)
        log_ratio_x = log_mean_prob(inputs.target) - log_px
        source, log_ratio_z, fallback_z = self._population(inputs, log_ratio_x)
        m_all = log_ratio_z.shape[0]
        if self.n_population is not None and m_all > self.n_population:
            pick = np.sort(np.random.default_rng(self.seed).choice(m_all, self.n_population, replace=False))
            log_ratio_z = log_ratio_z[pick]
        m = int(log_ratio_z.shape[0])
        fraction = pairwise_fraction_above(log_ratio_x, log_ratio_z, log_gamma=math.log(self.gamma))
        ties_before = tie_summary(fraction)
        scores = fraction if self.ties == "keep" else break_ties(np.rint(fraction * m), log_ratio_x, m)
        return scores, {"population": source, "n_population": m, "n_fallback": int(fallback_x),
                        "n_fallback_population": int(fallback_z), "ties": self.ties,
                        "ties_before_breaking": ties_before, "ties_after": tie_summary(scores)}


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
    ``info["n_fallback"]`` counts them.

    Attributes:
        a: the offline approximation coefficient in ``[0, 1]``, or ``"auto"`` (default): chosen on the
            reference models (module docstring, :func:`tune_offline_a`); needs keep masks and at least 2
            references. ``info["a"]`` is the value used, ``info["a_tuning"]`` what it was chosen on.
    """

    a: float | Literal["auto"] = "auto"

    online = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.a != "auto" and (isinstance(self.a, bool) or not isinstance(self.a, (int, float))
                                 or not 0.0 <= self.a <= 1.0):
            raise ValueError(f"a must be a number in [0, 1] or 'auto'; got {self.a!r}")

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

    def score_with_info(self, inputs: AttackInputs) -> tuple[np.ndarray, dict[str, Any]]:
        if self.a != "auto":
            scores, info = super().score_with_info(inputs)
            return scores, {**info, "a": float(self.a), "a_tuning": None}
        self._check(inputs)
        if inputs.reference_in is None or inputs.n_reference < 2:
            raise UserError("rmia_offline with a='auto' chooses a on the reference models and needs their keep "
                            f"masks and at least 2 of them (got {inputs.n_reference}); set attack.rmia_offline_a "
                            "to a number in [0, 1] (the paper's default is 0.3)")
        best, aucs = tune_offline_a(inputs, gamma=self.gamma, ties=self.ties)
        scores, info = dataclasses.replace(self, a=best).score_with_info(inputs)
        tuning = {"chosen_on": f"reference model 1 of {inputs.n_reference} attacked as a pseudo-target by the "
                               f"other {inputs.n_reference - 1} (same population); the target is not used",
                  "metric": "auc", "grid": list(aucs), "auc": [aucs[a] for a in aucs]}
        return scores, {**info, "a_tuning": tuning}


def pseudo_target_inputs(inputs: AttackInputs, pseudo: int = 0) -> tuple[AttackInputs, np.ndarray]:
    """The reference model ``pseudo`` as a target, the other references as its references; and its truth."""
    if inputs.reference is None or inputs.reference_in is None:
        raise ValueError("pseudo_target_inputs needs reference signals and keep masks")
    others = np.arange(inputs.n_reference) != pseudo
    has_pop = inputs.pop_reference is not None
    return AttackInputs(
        target=inputs.reference[pseudo], reference=inputs.reference[others], reference_in=inputs.reference_in[others],
        pop_target=inputs.pop_reference[pseudo] if has_pop else None,
        pop_reference=inputs.pop_reference[others] if has_pop else None,
        pop_reference_in=(inputs.pop_reference_in[others] if has_pop and inputs.pop_reference_in is not None
                          else None)), inputs.reference_in[pseudo]


def tune_offline_a(inputs: AttackInputs, *, grid: Sequence[float] = A_GRID, gamma: float = 1.0,
                   ties: Literal["likelihood_ratio", "keep"] = "likelihood_ratio",
                   pseudo: int = 0) -> tuple[float, dict[float, float]]:
    """Choose offline RMIA's ``a`` by attacking a reference model with the other references (paper, Sec. 4).

    Only reference models are attacked: reference ``pseudo`` is the pseudo-target, its keep mask the truth.

    Args:
        inputs: the attack's inputs (their ``target`` is not read).
        grid: candidate values of ``a`` in [0, 1].
        gamma, ties: RMIA's settings.
        pseudo: which reference model is the pseudo-target.

    Returns:
        ``(best_a, {a: AUC})``; ties go to the smaller ``a``.

    >>> rng = np.random.default_rng(0)
    >>> keep = rng.random((6, 200)) < 0.5
    >>> ref = rng.normal(size=(6, 200, 1)) + 2.0 * keep[..., None]
    >>> best, aucs = tune_offline_a(AttackInputs(target=ref[0], reference=ref, reference_in=keep), grid=(0.0, 1.0))
    >>> best in aucs and len(aucs)
    2
    """
    if not grid:
        raise ValueError("grid must contain at least one value of a")
    pseudo_inputs, truth = pseudo_target_inputs(inputs, pseudo)
    if truth.all() or not truth.any():
        raise UserError(f"reference model {pseudo + 1} has no members or no non-members in the pool: "
                        f"it cannot serve as the pseudo-target that chooses a; set attack.rmia_offline_a")
    aucs = {float(a): auc(RmiaOffline(a=float(a), gamma=gamma, ties=ties).score(pseudo_inputs), truth)
            for a in grid}
    best = max(aucs, key=lambda k: (aucs[k], -k))
    return best, aucs
