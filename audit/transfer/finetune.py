"""Fine-tuning transfer protocol: a new head on the downstream classes, trained non-privately or with DP.

The checkpoint is copied, its classifier replaced by a zero-initialised head for the downstream classes
(``reset_classifier``; a zero head is the usual start for DP fine-tuning, e.g. De et al. 2022, and needs no
random draw), and the copy is trained for ``steps`` logical steps on the downstream training split with
SGD, using the same step engine as ``audit train`` (:func:`training.dp.engine.make_stepper`):

* non-DP: batches of ``batch_size`` from seeded shuffles (epochs without replacement);
* DP: Poisson sampling at rate ``q = batch_size / n``, per-example clipping at ``max_grad_norm`` and Gaussian
  noise with the multiplier that reaches ``epsilon`` at ``delta`` after ``steps`` steps (the accountant
  named in the protocol), or the ``noise_multiplier`` given; the epsilon actually spent is recomputed and
  reported. The guarantee covers the downstream training split only (the unit is one downstream example).

``train_backbone: false`` freezes everything except the new head (DP linear probing). The test accuracy of
the fine-tuned copy is reported with its binomial confidence interval; the checkpoint itself is untouched.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from audit.transfer.metrics import AccuracyEstimate, accuracy_estimate
from audit.transfer.suite import FinetuneProtocol
from training.accounting import DPPhase, default_delta, epsilon_for, noise_multiplier_for
from training.config import OptimConfig, PrivacyConfig
from training.data import ImageSet, to_float_tensor
from training.dp.engine import make_stepper
from training.dp.sampling import PoissonSampler, ShuffleSampler
from training.errors import UserError

__all__ = ["FinetuneResult", "classifier_of", "replace_head", "predict", "finetune_evaluate"]


@dataclass(frozen=True, kw_only=True)
class FinetuneResult:
    """Outcome of :func:`finetune_evaluate`: test accuracy and the privacy parameters actually used."""

    accuracy: AccuracyEstimate
    dp: bool
    steps: int
    batch_size: int
    sample_rate: float
    train_backbone: bool
    trainable_params: int
    noise_multiplier: float | None
    epsilon: float | None
    delta: float | None
    accountant: str | None
    final_loss: float | None
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["accuracy"] = self.accuracy.to_dict()
        out["notes"] = list(self.notes)
        return out


def classifier_of(model: nn.Module) -> nn.Module:
    """The final classifier layer: timm's ``get_classifier()`` or the ``head`` of an ``ImageClassifier``.

    Raises:
        UserError: if the model exposes neither.
    """
    getter = getattr(model, "get_classifier", None)
    head = getter() if callable(getter) else getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        raise UserError(f"{type(model).__name__} exposes no classifier (get_classifier() or .head): it cannot be "
                        "fine-tuned on new classes; build it through training.models")
    return head


def replace_head(model: nn.Module, num_classes: int) -> list[nn.Parameter]:
    """Give ``model`` a zero-initialised classifier for ``num_classes`` outputs; return the head's parameters.

    Uses the timm-style ``reset_classifier`` the models expose.

    Raises:
        UserError: if the model has no ``reset_classifier`` or no classifier to find.
    """
    if not callable(getattr(model, "reset_classifier", None)):
        raise UserError(f"{type(model).__name__} has no reset_classifier(): it cannot be fine-tuned on new "
                        "classes; build it through training.models")
    model.reset_classifier(num_classes)
    head = list(classifier_of(model).parameters())
    with torch.no_grad():
        for p in head:
            p.zero_()
    return head


@torch.no_grad()
def predict(model: nn.Module, images: np.ndarray, *, device: torch.device | str, batch_size: int = 256) -> np.ndarray:
    """Arg-max class of ``model`` (eval mode) for uint8 (N, H, W, 3) images."""
    was_training = model.training
    model.eval()
    out = []
    try:
        for start in range(0, len(images), batch_size):
            xb = to_float_tensor(np.asarray(images[start:start + batch_size])).to(device)
            out.append(model(xb).argmax(dim=1).cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _int_seed(seed: np.random.SeedSequence | int, stream: int) -> int:
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(int(seed))
    return int(np.random.SeedSequence([*ss.generate_state(2), stream]).generate_state(1)[0])


def finetune_evaluate(model: nn.Module, train: ImageSet, test: ImageSet, *, protocol: FinetuneProtocol,
                      device: torch.device | str = "cpu", eval_batch_size: int = 256,
                      seed: np.random.SeedSequence | int = 0) -> FinetuneResult:
    """Fine-tune a copy of ``model`` on ``train`` as ``protocol`` says and score it on ``test``.

    Args:
        model: the checkpoint's module (left unchanged).
        train: downstream training split.
        test: downstream test split (same classes).
        protocol: steps, batch size, optimiser and (for DP) epsilon/delta/clipping.
        device: where to train.
        eval_batch_size: batch size of the test pass.
        seed: seed (or SeedSequence) of batch sampling and DP noise.

    Returns:
        :class:`FinetuneResult`.

    Raises:
        UserError: the model cannot take a new head, or the DP engine rejects it (e.g. BatchNorm layers).
    """
    notes: list[str] = []
    n = len(train)
    batch = int(protocol.batch_size)
    if batch > n:
        notes.append(f"batch_size {batch} > {n} training examples: using {n}")
        batch = n
    q = batch / n
    net = copy.deepcopy(model)
    head = replace_head(net, len(train.classes))
    net = net.to(device).train()
    if not protocol.train_backbone:
        head_ids = {id(p) for p in head}
        for p in net.parameters():
            p.requires_grad_(id(p) in head_ids)
    trainable = int(sum(p.numel() for p in net.parameters() if p.requires_grad))

    sigma = eps = delta = None
    if protocol.dp:
        delta = float(protocol.delta) if protocol.delta is not None else float(default_delta(n))
        sigma = float(protocol.noise_multiplier if protocol.noise_multiplier is not None else noise_multiplier_for(
            target_epsilon=protocol.epsilon, sample_rate=q, steps=protocol.steps, delta=delta,
            accountant=protocol.accountant))
        eps = float(epsilon_for(phases=[DPPhase(sigma, q, protocol.steps)], delta=delta,
                                accountant=protocol.accountant))
        privacy = PrivacyConfig(enabled=True, noise_multiplier=sigma, max_grad_norm=protocol.max_grad_norm,
                                accountant=protocol.accountant)
        sampler: Any = PoissonSampler(n, q, _int_seed(seed, 0))
    else:
        privacy = PrivacyConfig(enabled=False)
        sampler = ShuffleSampler(n, batch, _int_seed(seed, 0))
    optim = OptimConfig(name="sgd", lr=protocol.lr, momentum=protocol.momentum, weight_decay=protocol.weight_decay)
    generator = torch.Generator(device=device)
    generator.manual_seed(_int_seed(seed, 1))
    stepper = make_stepper(model=net, privacy=privacy, optim=optim, sample_rate=q, expected_batch_size=batch,
                           total_steps=protocol.steps, noise_multiplier=sigma or 0.0,
                           physical_batch_size=protocol.physical_batch_size, generator=generator, device=device)
    loss = None
    for step in range(protocol.steps):
        idx = sampler.indices(step)
        xb = to_float_tensor(train.x[idx]).to(device)
        yb = torch.as_tensor(train.y[idx], dtype=torch.long, device=device)
        stats = stepper.step(xb, yb)
        loss = getattr(stats, "loss", None)
    trained = stepper.close()  # the plain module, without Opacus's hooks
    pred = predict(trained, test.x, device=device, batch_size=eval_batch_size)
    acc = accuracy_estimate(correct=int(np.sum(pred == test.y)), total=len(test))
    return FinetuneResult(accuracy=acc, dp=bool(protocol.dp), steps=int(protocol.steps), batch_size=batch,
                          sample_rate=q, train_backbone=bool(protocol.train_backbone), trainable_params=trainable,
                          noise_multiplier=sigma, epsilon=eps, delta=delta,
                          accountant=protocol.accountant if protocol.dp else None,
                          final_loss=None if loss is None else float(loss), notes=tuple(notes))
