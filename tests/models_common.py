"""What the model tests share (tests/test_models*.py): tiny cases of every model family, builders, batches and
the two per-sample gradient computations they compare (a batch-size-1 loop and Opacus)."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from foundation.shared_root import shared_root

import torch
import torch.nn.functional as F
from opacus.grad_sample import GradSampleModule
from torch import nn

from training.config import ModelConfig
from training.models import (
    build_model,
)

SHARED = shared_root()  # $DP_AUDIT_SHARED, default ../shared
RESNET20_WEIGHTS = SHARED / "weights" / "resnet20-cifar10-12fca82f.th"
CIFAR10_EXACT_TEST = SHARED / "data" / "cifar10_exact" / "test.npz"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

TINY_VIT = {"embed_dim": 16, "depth": 1, "num_heads": 2}
# name -> (arch, kwargs, input_shape); tiny sizes so each case takes well under a second
CASES = {
    "small_cnn": ("small_cnn", {}, (3, 8, 8)),
    "mlp": ("mlp", {"hidden": (16,)}, (3, 8, 8)),
    "fastnet": ("fastnet", {"widths": (8, 16, 16)}, (3, 32, 32)),  # 2×2 at the last norm: GroupNorm needs > 1 value
    "resnet20_cifar": ("resnet20_cifar", {}, (3, 8, 8)),
    "import_path_resnet20": ("training.models.cifar_resnet:resnet20", {}, (3, 8, 8)),
    "timm_resnet": ("resnet18", {"layers": (1, 1, 1, 1), "channels": (8, 8, 16, 16)}, (3, 16, 16)),
    "timm_vit": ("vit_tiny_patch16_224", TINY_VIT, (3, 8, 8)),
    "timm_vit_reg_tokens": ("vit_tiny_patch16_224", {**TINY_VIT, "reg_tokens": 2, "no_embed_class": True},
                            (3, 8, 8)),
    "timm_convnext": ("convnext_atto", {"depths": (1, 1, 1, 1), "dims": (8, 8, 16, 16)}, (3, 32, 32)),
}
NUM_CLASSES = 5


def _build(case: str, **overrides):
    arch, kwargs, shape = CASES[case]
    cfg = ModelConfig(arch=arch, kwargs=kwargs, **overrides)
    return build_model(cfg, num_classes=NUM_CLASSES, input_shape=shape, seed=0, trust_code=True), shape


def _batch(shape, n=3, *, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, *shape, generator=g, dtype=dtype), torch.arange(n) % NUM_CLASSES


def _loop_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-example gradients of the summed cross-entropy, one example at a time (the reference)."""
    out: dict[str, list[torch.Tensor]] = {n: [] for n, p in model.named_parameters() if p.requires_grad}
    for i in range(len(x)):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum").backward()
        for n, p in model.named_parameters():
            if p.requires_grad:
                out[n].append(p.grad.detach().clone())
    model.zero_grad(set_to_none=True)
    return {n: torch.stack(g) for n, g in out.items()}


def _opacus_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mode: str) -> dict[str, torch.Tensor]:
    model = copy.deepcopy(model)
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum", strict=True,
                           force_functorch=mode == "functorch")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "full backward hook is firing ... no inputs require gradients"
            F.cross_entropy(gsm(x), y, reduction="sum").backward()
        return {n: p.grad_sample.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    finally:
        gsm._close()
