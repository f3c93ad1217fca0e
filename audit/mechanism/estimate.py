"""From Neyman–Pearson scores of many canary trials to an ε lower bound for the DP-SGD mechanism, and a verdict.

Why this estimator. The threat model is the strongest one (Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski,
Carlini, Terzis, "Tight Auditing of Differentially Private Machine Learning", USENIX Security 2023): the auditor
chooses the canary's gradient (a Dirac of norm C), sees every intermediate update, and so scores each trial with
the exact likelihood ratio of the mechanism (:mod:`audit.mechanism.scoring`); no test can separate members from
non-members better. What is left is the statistics of turning member / non-member scores into ε:

* Directly bounding (ε, δ) from one threshold's error rates (Jagielski et al. 2020; Clopper–Pearson) needs
  false-positive rates near e^{-ε}·δ-scale events at δ = 1e-5: tens of millions of trials for ε ≈ 8.
* Nasr et al. 2023 instead bound the *trade-off curve*: with μ-GDP (full batch, exactly the mechanism's family),
  μ_lb = Φ⁻¹(1 - FPR_ub) - Φ⁻¹(FNR_ub) from a threshold in the bulk, where ~10⁴ trials pin it to a few percent,
  then ε_lb = ε_GDP(μ_lb, δ). We do the same, generalised to the claim's own family
  (:mod:`audit.mechanism.family`): for Poisson subsampling the curve is not Gaussian and the GDP conversion
  would be wrong in both directions, so the curve comes from the subsampled Gaussian's privacy profile.
* One-run audits (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023;
  Mahloujifar, Melis, Chaudhuri, "Auditing f-Differential Privacy in One Run", 2024) need no independence
  between canaries but pay for it: their bounds saturate far below ε (0.3–0.45 of ε in
  ``results/reference/audit_tightness.md``). Here the trials are independent — each canary owns its
  coordinates and a correct implementation's noise is i.i.d. over coordinates — so plain binomial
  (Clopper–Pearson) intervals apply, and one run with m canaries is as tight as m separate runs.

The threshold: a grid of thresholds fixed before the audit (quantiles of the honest mechanism's scores
simulated with a fixed seed, :func:`threshold_grid`), every one evaluated at α/len(grid) (Bonferroni), each
error rate with a one-sided Clopper–Pearson bound at half of that; the reported bound is the best of the grid.
The verdict is ``VIOLATION`` only when ε_lb exceeds the claimed ε (:func:`audit.bounds.verdict.verdict`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from audit.bounds.clopper_pearson import clopper_pearson_upper, epsilon_from_scores_cp
from audit.bounds.estimate import EpsilonEstimate
from audit.bounds.thresholds import Bonferroni, counts_at_thresholds
from audit.mechanism.family import family_epsilon, sigma_upper_bound
from audit.mechanism.scoring import simulate_observations, trial_scores

__all__ = ["MechanismClaim", "threshold_grid", "mechanism_estimate", "FAMILY_ASSUMPTION", "GRID_SEED"]

FAMILY_ASSUMPTION = "the implementation's trade-off curve is that of DP-SGD at the claimed q and T (some σ)"
GRID_SEED = 20_231_103  # the reference simulation's seed: fixed, so the grid never depends on the audited scores
_REFERENCE_TRIALS = 20_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class MechanismClaim:
    """What the implementation claims: T steps of the Poisson-subsampled Gaussian (σ, q) and its (ε, δ).

    Attributes:
        noise_multiplier: σ > 0.
        sample_rate: q in (0, 1].
        steps: T ≥ 1.
        delta: δ in (0, 1).
        epsilon: the claimed ε (from the accountant at σ, q, T, δ).
        accountant: which accountant made ``epsilon`` (for the record).
    """

    noise_multiplier: float
    sample_rate: float
    steps: int
    delta: float
    epsilon: float
    accountant: str = "prv"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"noise_multiplier must be a finite number > 0, got {self.noise_multiplier!r}")
        if not 0.0 < self.sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate!r}")
        if isinstance(self.steps, bool) or int(self.steps) != self.steps or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {self.steps!r}")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
        if not (self.epsilon > 0):
            raise ValueError(f"epsilon must be > 0, got {self.epsilon!r}")

    @classmethod
    def from_accountant(cls, *, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                        accountant: str = "prv") -> MechanismClaim:
        """The claim whose ε the project's accountant computes at (σ, q, T, δ) (:mod:`training.accounting`)."""
        from training.accounting.epsilon import DPPhase, epsilon_for

        eps = epsilon_for(phases=[DPPhase(noise_multiplier, sample_rate, int(steps))], delta=delta,
                          accountant=accountant)
        return cls(noise_multiplier=float(noise_multiplier), sample_rate=float(sample_rate), steps=int(steps),
                   delta=float(delta), epsilon=float(eps), accountant=accountant)


def threshold_grid(claim: MechanismClaim, *, n_out: int, size: int = 12) -> np.ndarray:
    """Thresholds fixed before the audit: honest out-scores' quantiles at false-positive rates from ``20/n_out``
    (no rarer: a handful of events is all Clopper–Pearson could resolve) to 1/2, geometrically spaced.

    Full batch: the out-score is exactly ``N(-T/(2σ²), T/σ²)``; Poisson: the quantiles of a simulation of the
    honest mechanism with the fixed seed :data:`GRID_SEED` (independent of the audited trials).
    """
    if n_out < 1 or size < 1:
        raise ValueError(f"n_out and size must be >= 1, got {n_out} and {size}")
    fprs = np.geomspace(max(20.0 / n_out, 1e-6), 0.5, size) if 20.0 / n_out < 0.5 else np.array([0.5])
    s, q, T = claim.noise_multiplier, claim.sample_rate, claim.steps
    if q >= 1.0:
        from scipy import special

        return np.unique(-T / (2 * s * s) + math.sqrt(T) / s * special.ndtri(1.0 - fprs))
    n_ref = max(_REFERENCE_TRIALS, int(4 / fprs.min()))
    ref = np.concatenate([trial_scores(simulate_observations(members=np.zeros(min(n_ref - k, 20_000), bool),
                                                             steps=T, noise_multiplier=s, sample_rate=q,
                                                             rng=GRID_SEED + k), noise_multiplier=s, sample_rate=q)
                          for k in range(0, n_ref, 20_000)])
    return np.unique(np.quantile(ref, 1.0 - fprs))


def mechanism_estimate(*, scores_in: np.ndarray, scores_out: np.ndarray, claim: MechanismClaim,
                       alpha: float = 0.05, grid: np.ndarray | None = None) -> EpsilonEstimate:
    """ε lower bound (confidence ``1 - alpha``) of the mechanism that produced the scores, in the claim's family.

    Args:
        scores_in: Neyman–Pearson scores of the member trials (:func:`audit.mechanism.scoring.trial_scores`).
        scores_out: scores of the non-member trials.
        claim: the :class:`MechanismClaim` (its σ is where the search starts; its q, T fix the family).
        alpha: significance level in (0, 1), shared by the grid (Bonferroni).
        grid: thresholds fixed in advance (default :func:`threshold_grid`).

    Returns:
        An :class:`~audit.bounds.estimate.EpsilonEstimate` with ``method="mechanism"``; ``extra`` holds the
        threshold, the error-rate bounds, ``sigma_ub`` (every σ above it is refuted), ``mu_lb`` (full batch),
        ``claim_refuted`` (the test is impossible under the claimed σ: needs no family assumption) and the
        assumption-free Clopper–Pearson (ε, δ) bound from the same grid (``epsilon_lb_direct``, at its own α).

    Raises:
        ValueError: on empty or non-finite scores or α outside (0, 1).
    """
    s_in = np.asarray(scores_in, dtype=np.float64).reshape(-1)
    s_out = np.asarray(scores_out, dtype=np.float64).reshape(-1)
    if s_in.size == 0 or s_out.size == 0 or not (np.all(np.isfinite(s_in)) and np.all(np.isfinite(s_out))):
        raise ValueError("scores_in and scores_out must be non-empty and finite")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    grid = threshold_grid(claim, n_out=s_out.size) if grid is None else np.unique(np.asarray(grid, np.float64))
    a_test = alpha / grid.size
    fp, fn = counts_at_thresholds(scores_in=s_in, scores_out=s_out, thresholds=grid)
    fpr_ub = np.asarray(clopper_pearson_upper(k=fp, n=s_out.size, alpha=a_test / 2), dtype=np.float64)
    fnr_ub = np.asarray(clopper_pearson_upper(k=fn, n=s_in.size, alpha=a_test / 2), dtype=np.float64)
    q, T, s0 = claim.sample_rate, claim.steps, claim.noise_multiplier

    def sub(fpr: float, fnr: float, tol: float, span: float = 4.0) -> float:
        return sigma_upper_bound(fpr=fpr, fnr=fnr, sample_rate=q, steps=T, start=s0, rel_tol=tol, span=span)

    coarse = np.array([sub(a, b, 0.19) for a, b in zip(fpr_ub, fnr_ub)])  # shared dyadic σ lattice: cached curves
    best = int(np.argmin(coarse))
    sigma_ub = sub(float(fpr_ub[best]), float(fnr_ub[best]), 2e-3)
    eps = family_epsilon(sigma=sigma_ub, sample_rate=q, steps=T, delta=claim.delta)
    zero = float(clopper_pearson_upper(k=0, n=s_out.size, alpha=a_test / 2)), \
        float(clopper_pearson_upper(k=0, n=s_in.size, alpha=a_test / 2))
    ceiling = family_epsilon(sigma=sub(zero[0], zero[1], 0.19, 2.0), sample_rate=q, steps=T, delta=claim.delta)
    direct = epsilon_from_scores_cp(scores_in=s_in, scores_out=s_out, delta=claim.delta, alpha=alpha,
                                    threshold_strategy=Bonferroni(grid=grid))
    mu_lb = None if q < 1.0 else (0.0 if not math.isfinite(sigma_ub) else math.sqrt(T) / sigma_ub)
    return EpsilonEstimate(
        method="mechanism", epsilon_lb=float(eps), alpha=float(alpha), delta=float(claim.delta),
        counts={"fp": int(fp[best]), "tn": int(s_out.size - fp[best]), "n_neg": int(s_out.size),
                "fn": int(fn[best]), "tp": int(s_in.size - fn[best]), "n_pos": int(s_in.size)},
        ceiling=max(float(ceiling), float(eps)),
        assumptions=FAMILY_ASSUMPTION,
        extra={"threshold": float(grid[best]), "n_thresholds": int(grid.size), "alpha_per_test": float(a_test),
               "fpr_ub": float(fpr_ub[best]), "fnr_ub": float(fnr_ub[best]), "sigma_ub": float(sigma_ub),
               "mu_lb": mu_lb, "claim_refuted": bool(s0 > sigma_ub),
               "epsilon_lb_direct": float(direct.epsilon_lb)},
    )
