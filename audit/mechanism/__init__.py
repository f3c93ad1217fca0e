"""A tight audit of the DP-SGD mechanism implementation itself (white box, Dirac gradient canaries).

Modules: :mod:`~audit.mechanism.scoring` (the Neyman–Pearson score of one trial, the honest mechanism's math),
:mod:`~audit.mechanism.family` (trade-off curves of the claimed DP-SGD family), :mod:`~audit.mechanism.estimate`
(scores to an ε lower bound; why this estimator).
"""
