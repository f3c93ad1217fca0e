"""A tight audit of the DP-SGD mechanism implementation itself (white box, Dirac gradient canaries).

Pure math: :mod:`~audit.mechanism.scoring` (the Neyman–Pearson score of one trial, the honest mechanism's math),
:mod:`~audit.mechanism.family` (trade-off curves of the claimed DP-SGD family), :mod:`~audit.mechanism.estimate`
(scores to an ε lower bound; why this estimator). Targets: :mod:`~audit.mechanism.probe` (the canary model),
:mod:`~audit.mechanism.engine_target` (the project's engine), :mod:`~audit.mechanism.api` (entry points, a
user's Opacus optimizer included), :mod:`~audit.mechanism.mutants` (planted bugs, for tests and benchmarks);
:mod:`~audit.mechanism.result` (``mechanism.json``).
"""
