"""How often the mechanism audit's verdict refutes an *honest* implementation: its false-violation rate.

The verdict (:func:`audit.mechanism.result.score_and_judge`) says VIOLATION when the ε lower bound exceeds the
claim. Its α bounds the probability of that for a correct implementation (a union bound over the threshold grid
and both error rates), so the true rate is at most α and usually far below. Two ways to measure it:

* :func:`false_violation_probability`: the full-batch rule's probability, computed from 10⁵–10⁶ simulated audits
  without simulating a single trial. For q = 1 the honest scores are exactly ``N(∓T/(2σ²), T/σ²)`` and the rule
  only sees how many of them fall between consecutive grid thresholds, which is multinomial; the rule (one-sided
  Clopper–Pearson at α/(2·grid), μ_lb = Φ⁻¹(1 − FPR_ub) − Φ⁻¹(FNR_ub), VIOLATION iff ε_GDP(μ_lb) > claimed ε)
  is then applied to every draw. Precise enough to say how rare a false VIOLATION is (≈ 3.5·10⁻⁴ at σ = 2, T = 4,
  8,000 trials).
* :func:`simulated_false_violations`: the estimator itself (:func:`~audit.mechanism.estimate.mechanism_estimate`
  and the verdict) on the honest mechanism's math (:func:`~audit.mechanism.scoring.simulate_observations`), one
  audit per seed: cheap enough for hundreds of seeds. Under Poisson sampling it counts audits whose error-rate
  bounds refute the claimed trade-off curve at some grid threshold, which every VIOLATION needs (its ε_lb comes
  from a σ below the claim's), so it bounds the false-VIOLATION rate from above without the PLD search per audit.

>>> from audit.mechanism.estimate import MechanismClaim
>>> claim = MechanismClaim.from_accountant(noise_multiplier=2.0, sample_rate=1.0, steps=4, delta=1e-5)
>>> false_violation_probability(claim, trials=8000, draws=20_000, rng=0) < 0.005
True
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from audit.bounds.clopper_pearson import clopper_pearson_upper
from audit.bounds.gdp import eps_from_mu
from audit.bounds.thresholds import counts_at_thresholds
from audit.bounds.verdict import verdict
from audit.mechanism.estimate import MechanismClaim, mechanism_estimate, threshold_grid
from audit.mechanism.family import refutes
from audit.mechanism.scoring import simulate_observations, trial_scores

__all__ = ["false_violation_probability", "simulated_false_violations", "claim_mu"]


def claim_mu(claim: MechanismClaim) -> float:
    """The GDP μ whose ε at δ is the claimed ε: a full-batch VIOLATION is μ_lb above it."""
    f = lambda mu: eps_from_mu(mu=mu, delta=claim.delta) - claim.epsilon  # noqa: E731
    hi = 1.0
    while f(hi) < 0:
        hi *= 2.0
    return float(optimize.brentq(f, 1e-9, hi, xtol=1e-12))


def false_violation_probability(claim: MechanismClaim, *, trials: int, alpha: float = 0.05, draws: int = 1_000_000,
                                rng: np.random.Generator | int | None = 0, details: bool = False
                                ) -> float | tuple[float, float, float]:
    """Probability that the verdict is VIOLATION for an honest full-batch implementation of ``claim``.

    Args:
        claim: a full-batch claim (q = 1).
        trials: trials per audit, half members.
        alpha: the audit's α.
        draws: simulated audits.
        rng: seed or generator.

        details: also return the mean and standard deviation of μ_lb over the draws.

    Returns:
        The fraction of the ``draws`` audits that were VIOLATION (with ``details``: and μ_lb's mean and sd).

    Raises:
        ValueError: for q < 1 (no closed-form score law) or fewer than 2 trials.
    """
    if claim.sample_rate < 1.0:
        raise ValueError("false_violation_probability needs a full-batch claim (q = 1); use "
                         "simulated_false_violations under Poisson sampling")
    n = int(trials) // 2
    if n < 1:
        raise ValueError(f"trials must be >= 2, got {trials}")
    rng = np.random.default_rng(rng)
    grid = threshold_grid(claim, n_out=n)
    a = alpha / grid.size
    ub = np.asarray(clopper_pearson_upper(k=np.arange(n + 1), n=n, alpha=a / 2), dtype=np.float64)
    z_fp, z_fn = -special.ndtri(ub), special.ndtri(ub)  # Φ⁻¹(1 − FPR_ub), Φ⁻¹(FNR_ub)
    mu = math.sqrt(claim.steps) / claim.noise_multiplier
    edges = np.concatenate([[-np.inf], grid, [np.inf]]) / mu  # score / μ ~ N(∓μ/2, 1)
    p_out, p_in = np.diff(special.ndtr(edges + mu / 2)), np.diff(special.ndtr(edges - mu / 2))
    mu_star, bad, done, s1, s2 = claim_mu(claim), 0, 0, 0.0, 0.0
    while done < draws:
        k = min(100_000, draws - done)
        fp = n - np.cumsum(rng.multinomial(n, p_out, size=k), axis=1)[:, :-1]  # out scores >= threshold j
        fn = np.cumsum(rng.multinomial(n, p_in, size=k), axis=1)[:, :-1]  # in scores < threshold j
        mu_lb = (z_fp[fp] - z_fn[fn]).max(axis=1)
        bad += int((mu_lb > mu_star).sum())
        s1, s2, done = s1 + float(mu_lb.sum()), s2 + float(np.square(mu_lb).sum()), done + k
    if not details:
        return bad / draws
    mean = s1 / draws
    return bad / draws, mean, math.sqrt(max(s2 / draws - mean * mean, 0.0))


def simulated_false_violations(claim: MechanismClaim, *, trials: int, seeds: range, alpha: float = 0.05,
                               noise_scale: float = 1.0) -> int:
    """How many of the audits seeded ``seeds`` refute ``claim`` on the mechanism's math (module docstring).

    Args:
        claim: the claim audited.
        trials: trials per audit, half members.
        seeds: one audit per seed.
        alpha: the audit's α.
        noise_scale: 1 for the honest mechanism; below 1 a broken one (the count then measures power).

    Returns:
        Full batch: the number of VIOLATION verdicts; Poisson: the number of audits refuting the claimed curve.
    """
    n = int(trials) // 2
    members = np.arange(2 * n) < n
    grid = threshold_grid(claim, n_out=n)
    a, q = alpha / grid.size, claim.sample_rate
    bad = 0
    for seed in seeds:
        x = simulate_observations(members=members, steps=claim.steps, noise_multiplier=claim.noise_multiplier,
                                  sample_rate=q, rng=seed, noise_scale=noise_scale)
        s = trial_scores(x, noise_multiplier=claim.noise_multiplier, sample_rate=q)
        if q >= 1.0:
            est = mechanism_estimate(scores_in=s[members], scores_out=s[~members], claim=claim, alpha=alpha,
                                     grid=grid)
            bad += str(verdict(claimed_epsilon=claim.epsilon, estimates=[est]).status) == "VIOLATION"
            continue
        fp, fn = counts_at_thresholds(scores_in=s[members], scores_out=s[~members], thresholds=grid)
        fpr = clopper_pearson_upper(k=fp, n=n, alpha=a / 2)
        fnr = clopper_pearson_upper(k=fn, n=n, alpha=a / 2)
        bad += any(refutes(sigma=claim.noise_multiplier, fpr=float(u), fnr=float(v), sample_rate=q,
                           steps=claim.steps) for u, v in zip(fpr, fnr))
    return bad
