"""A tight audit of the DP-SGD mechanism implementation itself (white box, Dirac gradient canaries).

Pure math: :mod:`~audit.mechanism.scoring` (the Neyman–Pearson score of one trial, the honest mechanism's math),
:mod:`~audit.mechanism.family` (trade-off curves of the claimed DP-SGD family), :mod:`~audit.mechanism.estimate`
(scores to an ε lower bound; why this estimator), :mod:`~audit.mechanism.false_rate` (how often the verdict refutes
an honest implementation). Targets: :mod:`~audit.mechanism.probe` (the canary model),
:mod:`~audit.mechanism.engine_target` (the project's engine, every ``grad_sample_mode``),
:mod:`~audit.mechanism.config_target` (the engine as a training config sets it up, before training),
:mod:`~audit.mechanism.opacus_target` (a user's Opacus optimizer and sampler), :mod:`~audit.mechanism.api` (entry
points); planted bugs for tests and benchmarks: :mod:`~audit.mechanism.mutants` (the engine),
:mod:`~audit.mechanism.opacus_mutants` (a user's Opacus set-up); :mod:`~audit.mechanism.result`
(``mechanism.json``, signed evidence bound to the run's claim).
"""
