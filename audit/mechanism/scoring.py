"""The optimal (Neyman–Pearson) score of one Dirac-canary trial of DP-SGD, and the honest mechanism's own draws.

One *trial* is one canary: an example whose per-sample gradient is ``s_t · S · v`` at step ``t``, with ``v`` a unit
direction on coordinates no other example touches, ``S`` far above the clipping norm C (so clipping makes it
exactly ``C · v``, the worst case) and ``s_t = ±1`` a sign pattern the auditor fixes in advance. The auditor sees
every update, so from the parameters before and after step ``t`` it reads

    y_t = ⟨noisy clipped sum of step t, v⟩ / C  =  s_t · b_t  +  σ · z_t,      z_t ~ N(0, 1) i.i.d.,

where ``b_t = 1`` when the canary is in step t's batch (always with full batch, with probability q under Poisson
sampling, never when the canary is not in the data set). Multiplying by ``s_t`` gives ``x_t = s_t · y_t``, whose
law is ``N(0, σ²)`` without the canary ("out") and ``(1 - q) N(0, σ²) + q N(1, σ²)`` with it ("in"), step by step
and independently. The likelihood-ratio (Neyman–Pearson) statistic of the whole trajectory is therefore the sum
of the per-step log-likelihood ratios

    ℓ(x) = log(1 - q + q · exp((x - 1/2) / σ²))        (= (x - 1/2) / σ² for q = 1),

which is the most powerful test at every false-positive rate (higher score = member). The sign pattern does not
change any of this for a correct implementation; it makes an implementation that re-uses one noise draw in
every step obvious (the noise cancels in the alternating sum, see Nasr et al. 2023 on adaptive canaries).

>>> import numpy as np
>>> x = np.array([[0.5, 0.5]])
>>> trial_scores(x, noise_multiplier=1.0, sample_rate=1.0).tolist()
[0.0]
>>> round(float(trial_scores(np.array([[1.0]]), noise_multiplier=1.0, sample_rate=0.5)[0]), 6)  # log(½ + ½·e^½)
0.28093
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["step_llr", "trial_scores", "alternating_signs", "simulate_observations"]


def _check(noise_multiplier: float, sample_rate: float) -> tuple[float, float]:
    sigma, q = float(noise_multiplier), float(sample_rate)
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier!r}")
    if not 0.0 < q <= 1.0:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    return sigma, q


def step_llr(x: np.ndarray, *, noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """Per-step log-likelihood ratio ``log(1 - q + q·exp((x - ½)/σ²))`` of "in" against "out" (elementwise).

    Args:
        x: sign-corrected observations ``s_t · y_t`` in units of the clipping norm (any shape).
        noise_multiplier: σ of the claim.
        sample_rate: q of the claim, in (0, 1].

    Returns:
        The log-likelihood ratios, same shape (computed stably in the log domain).

    Raises:
        ValueError: on σ ≤ 0 or q outside (0, 1].
    """
    sigma, q = _check(noise_multiplier, sample_rate)
    a = (np.asarray(x, dtype=np.float64) - 0.5) / (sigma * sigma)
    if q == 1.0:
        return a
    return np.logaddexp(math.log1p(-q), math.log(q) + a)


def trial_scores(x: np.ndarray, *, noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """The Neyman–Pearson score of each trial: the sum over steps of :func:`step_llr`.

    Args:
        x: ``(trials, steps)`` sign-corrected observations in units of C.
        noise_multiplier: σ of the claim.
        sample_rate: q of the claim.

    Returns:
        ``(trials,)`` scores, higher = member.

    Raises:
        ValueError: if ``x`` is not 2-D or holds a non-finite value, or σ/q are out of range.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"observations must be a (trials, steps) array with steps >= 1, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("observations hold NaN or inf: the implementation under test produced non-finite updates")
    return step_llr(x, noise_multiplier=noise_multiplier, sample_rate=sample_rate).sum(axis=1)


def alternating_signs(steps: int) -> np.ndarray:
    """The canary's sign pattern ``+1, -1, +1, …`` over ``steps`` steps (float64).

    >>> alternating_signs(4).tolist()
    [1.0, -1.0, 1.0, -1.0]
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    return np.where(np.arange(steps) % 2 == 0, 1.0, -1.0)


def simulate_observations(*, members: np.ndarray, steps: int, noise_multiplier: float, sample_rate: float,
                          rng: np.random.Generator | int | None = None, noise_scale: float = 1.0,
                          rate_scale: float = 1.0, reuse_noise: bool = False) -> np.ndarray:
    """Sign-corrected observations ``x`` of the DP-SGD mechanism's math itself (no model, no optimizer).

    The fast vectorised path: what a correct implementation produces, ``x_t = b_t + σ z_t``, and three knobs
    that turn it into a broken one (for tests and the planted-bug benchmark).

    Args:
        members: ``(trials,)`` bool, True where the canary is in the data set.
        steps: T ≥ 1.
        noise_multiplier: σ actually used (the claim's σ for an honest run).
        sample_rate: q of the claim.
        rng: seed or generator.
        noise_scale: multiplies the noise std (0.8: noise 20 % too small).
        rate_scale: multiplies the actual sample rate (2: batches drawn at 2q), capped at 1.
        reuse_noise: draw the noise once per trial and add it at every step (with the alternating signs).

    Returns:
        ``(trials, steps)`` float64 observations.
    """
    sigma, q = _check(noise_multiplier, sample_rate)
    rng = np.random.default_rng(rng)
    members = np.asarray(members, dtype=bool).reshape(-1)
    n = members.size
    if reuse_noise:
        z = rng.standard_normal((n, 1)) * alternating_signs(steps)[None, :]
    else:
        z = rng.standard_normal((n, steps))
    q_real = min(1.0, q * rate_scale)
    b = np.ones((n, steps)) if q_real >= 1.0 else (rng.random((n, steps)) < q_real).astype(np.float64)
    return members[:, None] * b + sigma * noise_scale * z
