"""The multi-run setting: n models trained with a canary, n without, one score per model.

Jagielski, Ullman, Oprea (NeurIPS 2020) and Nasr et al. (USENIX Security 2023) train many models on neighbouring
datasets (with / without the canary) and score the canary in each: every model is one independent trial, so the
threshold counts are binomial and both the Clopper–Pearson and the GDP bounds apply.
"""

from __future__ import annotations

import dataclasses

from audit.bounds._validate import check_alpha, check_delta, check_scores
from audit.bounds.clopper_pearson import epsilon_from_scores_cp
from audit.bounds.estimate import EpsilonEstimate
from audit.bounds.gdp import epsilon_from_scores_gdp
from audit.bounds.thresholds import ThresholdStrategy

__all__ = ["epsilon_multi_run"]


def epsilon_multi_run(
    *,
    scores_with: object,
    scores_without: object,
    delta: float,
    alpha: float,
    threshold_strategy: ThresholdStrategy,
) -> list[EpsilonEstimate]:
    """Clopper–Pearson and GDP ε lower bounds from per-model canary scores.

    Each estimate holds at confidence ``1 - alpha`` on its own; a decision that uses both (e.g.
    :func:`audit.bounds.verdict.verdict`) is wrong with probability at most ``2 * alpha`` (union bound). The GDP
    estimate needs δ > 0 and is omitted when ``delta == 0``.

    Args:
        scores_with: The canary's score in each model trained WITH it (higher = member).
        scores_without: The canary's score in each model trained WITHOUT it.
        delta: δ of the claim, in [0, 1).
        alpha: Significance level of each estimate, in (0, 1).
        threshold_strategy: :class:`~audit.bounds.thresholds.HeldOut` or
            :class:`~audit.bounds.thresholds.Bonferroni`.

    Returns:
        ``[clopper_pearson]`` or ``[clopper_pearson, gdp]``; ``extra`` records ``setting="multi_run"`` and the
        numbers of models.

    Raises:
        ValueError: On empty or non-finite scores, or α/δ out of range.

    >>> import numpy as np
    >>> from audit.bounds.thresholds import Bonferroni
    >>> ests = epsilon_multi_run(scores_with=np.full(200, 1.0), scores_without=np.zeros(200), delta=1e-5,
    ...                          alpha=0.05, threshold_strategy=Bonferroni(grid=[0.5]))
    >>> [e.method for e in ests], ests[0].counts["n_pos"]
    (['clopper_pearson', 'gdp'], 200)
    """
    s_with = check_scores(scores_with, "scores_with")
    s_without = check_scores(scores_without, "scores_without")
    delta = check_delta(delta)
    alpha = check_alpha(alpha)
    setting = {"setting": "multi_run", "n_models_with": int(s_with.size), "n_models_without": int(s_without.size)}
    estimates = [epsilon_from_scores_cp(scores_in=s_with, scores_out=s_without, delta=delta, alpha=alpha,
                                        threshold_strategy=threshold_strategy)]
    if delta > 0.0:
        estimates.append(epsilon_from_scores_gdp(scores_in=s_with, scores_out=s_without, delta=delta, alpha=alpha,
                                                 threshold_strategy=threshold_strategy))
    return [dataclasses.replace(e, extra={**e.extra, **setting}) for e in estimates]
