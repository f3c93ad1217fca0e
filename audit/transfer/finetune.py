"""Fine-tuning transfer protocol: a new head on the downstream classes, trained non-privately or with DP.

The checkpoint is copied, its classifier replaced by a zero-initialised head for the downstream classes
(a zero head is the usual start for DP fine-tuning, e.g. De et al. 2022, and needs no random draw), and the copy
is trained for ``steps`` logical steps on the downstream training split with SGD by the project's one DP
fine-tuning loop (:func:`training.recipes.finetune.finetune`, the loop ``audit train``'s ``finetune`` recipe runs):

* non-DP: batches of ``batch_size`` from seeded shuffles (epochs without replacement);
* DP: Poisson sampling at rate ``q = batch_size / n``, per-example clipping at ``max_grad_norm`` and Gaussian
  noise with the multiplier that reaches ``epsilon`` at ``delta`` after ``steps`` steps (the accountant
  named in the protocol), or the ``noise_multiplier`` given; the epsilon actually spent is recomputed and
  reported. The guarantee covers the downstream training split only (the unit is one downstream example).

``train_backbone: false`` trains only the new head (a DP linear-probing phase, ``lp``); otherwise everything
(``fft``). The test accuracy of the fine-tuned copy (:func:`training.evaluate.predict`) is reported with its
binomial confidence interval; the checkpoint itself is untouched.
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
from training.data import ImageSet
from training.evaluate import predict
from training.recipes.budget import PhaseBudget
from training.recipes.finetune import finetune, finetune_phases, new_head

__all__ = ["FinetuneResult", "finetune_evaluate"]


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
    else:
        privacy = PrivacyConfig(enabled=False, sampling="shuffle")
    optim = OptimConfig(name="sgd", lr=protocol.lr, momentum=protocol.momentum, weight_decay=protocol.weight_decay)
    net = copy.deepcopy(model)
    head = new_head(net, len(train.classes), init="zero")
    net = net.to(device).train()
    backbone = [name for name, p in net.named_parameters() if p.requires_grad]
    plan = [PhaseBudget(name="fft" if protocol.train_backbone else "lp", steps=int(protocol.steps),
                        noise_multiplier=sigma or 0.0)]
    run_seed = _int_seed(seed, 0)
    phases = finetune_phases(plan, head=head, backbone=backbone, x=train.x, y=train.y, dataset=train.name,
                             batch_size=batch, privacy=privacy, optim=optim, seed=run_seed)
    params = dict(net.named_parameters())
    trainable = int(sum(params[name].numel() for name in phases[0].trainable))
    out = finetune(net, phases, seed=run_seed, device=device, physical_batch_size=protocol.physical_batch_size)
    loss = out.final_loss
    pred = predict(out.model, test.x, device=device, batch_size=eval_batch_size)
    acc = accuracy_estimate(correct=int(np.sum(pred == test.y)), total=len(test))
    return FinetuneResult(accuracy=acc, dp=bool(protocol.dp), steps=int(protocol.steps), batch_size=batch,
                          sample_rate=q, train_backbone=bool(protocol.train_backbone), trainable_params=trainable,
                          noise_multiplier=sigma, epsilon=eps, delta=delta,
                          accountant=protocol.accountant if protocol.dp else None,
                          final_loss=None if loss is None else float(loss), notes=tuple(notes))
