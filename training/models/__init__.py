"""Models: registry, timm adapters, the ``ImageClassifier`` wrapper and DP compatibility fixes.

Public API:

* :func:`build_model` (``ModelConfig`` → :class:`BuiltModel`; import paths only with ``trust_code=True``),
  :func:`names_code`, :func:`count_parameters`;
* :class:`ImageClassifier` (float [0, 1] images in, logits out; ``forward_features``, ``forward_head``,
  ``head``, ``reset_classifier``, ``feature_blocks``);
* :data:`MODELS` / :func:`register_model` (``small_cnn``, ``mlp``, ``resnet20_cifar``);
* :func:`load_weights_file` (safetensors or weights-only torch files);
* :func:`replace_batchnorm`, :func:`dp_issues`, :func:`apply_freeze`, :func:`patch_vit_tokens`.
"""

from training.models.build import BuiltModel, build_model, count_parameters, create_network, names_code
from training.models.classifier import ImageClassifier, has_timm_protocol
from training.models.dp_compat import apply_freeze, dp_issues, frozen_parameters, replace_batchnorm
from training.models.registry import MODELS, ModelRegistry, register_model
from training.models.vit_tokens import TokenEmbedding, patch_vit_tokens
from training.models.weights import load_state_strict, load_weights_file

__all__ = [
    "BuiltModel",
    "build_model",
    "count_parameters",
    "create_network",
    "names_code",
    "ImageClassifier",
    "has_timm_protocol",
    "apply_freeze",
    "dp_issues",
    "frozen_parameters",
    "replace_batchnorm",
    "MODELS",
    "ModelRegistry",
    "register_model",
    "TokenEmbedding",
    "patch_vit_tokens",
    "load_state_strict",
    "load_weights_file",
]
