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

from audit.transfer.distortion import DistortionResult, feature_distortion, relative_feature_change
from audit.transfer.knn import KnnResult, knn_classify, knn_predict
from audit.transfer.metrics import AccuracyEstimate, accuracy_estimate, binomial_ci
from audit.transfer.probes import LinearProbeResult, linear_probe
from audit.transfer.separability import (
    GeometricDecay,
    LayerSeparation,
    fisher_separability,
    fit_geometric_decay,
    least_squares_residual,
    scatter_matrices,
    separation_fuzziness,
    separation_profile,
)

__all__ = [
    "AccuracyEstimate",
    "accuracy_estimate",
    "binomial_ci",
    "LinearProbeResult",
    "linear_probe",
    "KnnResult",
    "knn_predict",
    "knn_classify",
    "scatter_matrices",
    "separation_fuzziness",
    "fisher_separability",
    "least_squares_residual",
    "GeometricDecay",
    "fit_geometric_decay",
    "LayerSeparation",
    "separation_profile",
    "DistortionResult",
    "feature_distortion",
    "relative_feature_change",
]
