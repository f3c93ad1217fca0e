"""Empirical ε: lower confidence bounds on a model's privacy loss from attack outcomes, and verdicts.

Estimators (all pure functions over counts or scores; higher score = member):

* :mod:`~audit.bounds.clopper_pearson` — Jagielski, Ullman, Oprea 2020: Clopper–Pearson bounds on FPR/FNR.
* :mod:`~audit.bounds.gdp` — Nasr et al. 2023: μ-GDP lower bound and the Dong–Roth–Su μ ↔ (ε, δ) conversion.
* :mod:`~audit.bounds.multi_run` — both of the above for n models with / n without a canary.
* :mod:`~audit.bounds.one_run` — Steinke, Nasr, Jagielski 2023: one training run, m canaries, (k₊, k₋) guesses.
* :mod:`~audit.bounds.one_run_fdp` — Mahloujifar, Melis, Chaudhuri 2024: one run against a Gaussian curve.
* :mod:`~audit.bounds.verdict` — VIOLATION / CONSISTENT / NO_CLAIM against the claimed ε.

Each returns an :class:`EpsilonEstimate` with the raw counts, α, δ and the ceiling (the largest bound the
estimator could give with the same totals and α).
"""

from audit.bounds.clopper_pearson import (
    clopper_pearson_interval,
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_clopper_pearson,
    epsilon_from_scores_cp,
)
from audit.bounds.estimate import EpsilonEstimate
from audit.bounds.gdp import (
    eps_from_mu,
    epsilon_from_scores_gdp,
    epsilon_gdp,
    gdp_delta,
    gdp_mu_lower_bound,
    mu_from_eps,
)
from audit.bounds.guesses import GuessCounts, one_run_guess_counts
from audit.bounds.multi_run import epsilon_multi_run
from audit.bounds.one_run import epsilon_one_run, epsilon_one_run_from_scores, one_run_pvalue
from audit.bounds.one_run_fdp import (
    epsilon_one_run_fdp,
    epsilon_one_run_fdp_from_scores,
    mu_one_run_fdp,
    one_run_fdp_rejects,
)
from audit.bounds.thresholds import Bonferroni, HeldOut, ThresholdStrategy, counts_at_thresholds
from audit.bounds.verdict import Finding, Verdict, VerdictStatus, verdict

__all__ = [
    "EpsilonEstimate",
    "clopper_pearson_interval",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "epsilon_clopper_pearson",
    "epsilon_from_scores_cp",
    "eps_from_mu",
    "mu_from_eps",
    "gdp_delta",
    "gdp_mu_lower_bound",
    "epsilon_gdp",
    "epsilon_from_scores_gdp",
    "epsilon_multi_run",
    "GuessCounts",
    "one_run_guess_counts",
    "one_run_pvalue",
    "epsilon_one_run",
    "epsilon_one_run_from_scores",
    "one_run_fdp_rejects",
    "mu_one_run_fdp",
    "epsilon_one_run_fdp",
    "epsilon_one_run_fdp_from_scores",
    "HeldOut",
    "Bonferroni",
    "ThresholdStrategy",
    "counts_at_thresholds",
    "Finding",
    "Verdict",
    "VerdictStatus",
    "verdict",
]
