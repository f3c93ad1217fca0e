"""What the empirical-ε estimator tests share (tests/test_epsilon_estimators.py, tests/test_epsilon_one_run.py):
the number of seeded null trials, alpha, and the binomial slack a valid bound may show in them."""

from __future__ import annotations

from scipy import stats

N_TRIALS = 200
ALPHA = 0.05


def _max_false_positives(trials: int, alpha: float, tail: float = 1e-3) -> int:
    """Largest number of non-zero bounds among ``trials`` null trials that is still consistent with validity.

    Under the null each trial is non-zero with probability <= alpha independently, so the count is stochastically
    below Bin(trials, alpha); exceeding its (1 - tail) quantile would happen with probability < tail.
    """
    return int(stats.binom.ppf(1.0 - tail, trials, alpha))
