"""Downstream transfer evaluation and representation diagnostics (``audit transfer``).

Pure math (numpy / scikit-learn, no torch):

* :mod:`audit.transfer.metrics`: accuracy with Wilson / Clopper-Pearson intervals;
* :mod:`audit.transfer.probes`: linear probe (standardised features, C chosen on a validation split);
* :mod:`audit.transfer.knn`: cosine k-NN with ``exp(s / tau)`` votes;
* :mod:`audit.transfer.separability`: scatter matrices, separation fuzziness, Fisher separability,
  least-squares residual, geometric decay across layers (He & Su 2023);
* :mod:`audit.transfer.distortion`: k-NN accuracy and relative feature change along checkpoints.

With models and data (torch): :mod:`audit.transfer.suite` (the YAML schema), :mod:`audit.transfer.features`
(pooled per-layer features and their cache), :mod:`audit.transfer.finetune` (non-DP / DP fine-tuning),
:mod:`audit.transfer.runner` (:func:`~audit.transfer.runner.evaluate_transfer`, writes ``transfer.json``) and
:mod:`audit.transfer.summary` (display rows).
"""

# The package re-exports each pure-math module's public API (its ``__all__``), so the list lives in one place.
from audit.transfer import distortion, knn, metrics, probes, separability
from audit.transfer.distortion import *  # noqa: F403
from audit.transfer.knn import *  # noqa: F403
from audit.transfer.metrics import *  # noqa: F403
from audit.transfer.probes import *  # noqa: F403
from audit.transfer.separability import *  # noqa: F403

__all__ = [*metrics.__all__, *probes.__all__, *knn.__all__, *separability.__all__, *distortion.__all__]
