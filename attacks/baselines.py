"""Baseline attacks: LOSS, Attack-P (population threshold) and difficulty-calibrated loss.

All scores are "higher = member". Losses are cross-entropy losses ``softplus(-phi)`` averaged over the
augmented queries of each example.

- ``loss``: Yeom et al., "Privacy Risk in Machine Learning" (CSF 2018): members have low loss.
- ``attack_p``: Ye et al., "Enhanced Membership Inference Attacks against Machine Learning Models"
  (CCS 2022), Attack-P: compare the loss with the target model's losses on population data.
- ``calibrated_loss``: Watson et al., "On the Importance of Difficulty Calibration in Membership Inference
  Attacks" (ICLR 2022): subtract each example's mean loss under reference models that did not train on it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from attacks.registry import Attack, AttackInputs, register_attack
from attacks.signals import loss_from_phi

__all__ = ["LossAttack", "AttackP", "CalibratedLoss", "mean_loss"]


def mean_loss(phi: np.ndarray) -> np.ndarray:
    """Cross-entropy loss averaged over the last (augmentation) axis: ``(..., A) -> (...)``, in float64.

    3-D inputs (reference models first) are processed one model at a time to bound temporary memory.

    >>> float(mean_loss(np.array([[0.0, 0.0]]))[0])
    0.6931471805599453
    """
    if phi.ndim == 3:
        return np.stack([loss_from_phi(p).mean(axis=-1) for p in phi]) if len(phi) else np.empty(phi.shape[:2])
    return loss_from_phi(phi).mean(axis=-1)


@register_attack("loss")
@dataclasses.dataclass(frozen=True, kw_only=True)
class LossAttack(Attack):
    """LOSS attack (Yeom et al. 2018): score = ``-loss``, averaged over augmentations; higher = member.

    >>> LossAttack().score(AttackInputs(target=np.array([[5.0], [-5.0]]))).round(4).tolist()
    [-0.0067, -5.0067]
    """

    needs_reference = False
    online = False

    def score_with_info(self, inputs: AttackInputs) -> tuple[np.ndarray, dict[str, Any]]:
        self._check(inputs)
        return -mean_loss(inputs.target), {}


def upper_tail_fraction(values: np.ndarray, population: np.ndarray) -> np.ndarray:
    """For each value, the fraction of ``population`` strictly above it, ties counted one half.

    Vectorised with one sort and two ``searchsorted`` calls: ``O((n + m) log m)``.

    >>> upper_tail_fraction(np.array([0.0, 1.0, 5.0]), np.array([1.0, 2.0, 3.0, 4.0])).tolist()
    [1.0, 0.875, 0.0]
    """
    pop = np.sort(np.asarray(population, dtype=np.float64))
    if pop.size == 0:
        raise ValueError("population must not be empty")
    lo = np.searchsorted(pop, values, side="left")
    hi = np.searchsorted(pop, values, side="right")
    return ((pop.size - hi) + 0.5 * (hi - lo)) / pop.size


@register_attack("attack_p")
@dataclasses.dataclass(frozen=True, kw_only=True)
class AttackP(Attack):
    """Attack-P (Ye et al. 2022): the example's loss ranked against the target's population losses.

    score(x) = fraction of population losses above ``loss(x)`` (ties count 1/2), i.e. one minus the
    empirical CDF of the population loss at ``loss(x)``. Thresholding it at ``1 - alpha`` is Attack-P at
    false-positive rate ``alpha`` on the population. Higher = member (members have low loss).

    The population is ``inputs.pop_target`` (samples known to be OUT of the target); without it, the queried
    examples themselves (then the ranking equals the LOSS attack's, only the scale is calibrated).

    >>> inputs = AttackInputs(target=np.array([[4.0], [0.0]]), pop_target=np.array([[1.0], [-1.0], [-2.0]]))
    >>> AttackP().score(inputs).tolist()
    [1.0, 0.6666666666666666]
    """

    needs_reference = False
    online = False

    def score_with_info(self, inputs: AttackInputs) -> tuple[np.ndarray, dict[str, Any]]:
        self._check(inputs)
        source = "pop_target" if inputs.pop_target is not None else "queried"
        pop = inputs.pop_target if inputs.pop_target is not None else inputs.target
        scores = upper_tail_fraction(mean_loss(inputs.target), mean_loss(pop))
        return scores, {"population": source, "n_population": int(pop.shape[0])}


@register_attack("calibrated_loss")
@dataclasses.dataclass(frozen=True, kw_only=True)
class CalibratedLoss(Attack):
    """Difficulty-calibrated loss (Watson et al. 2022): ``mean OUT-reference loss - target loss``.

    The reference loss of an example is averaged over the references that did NOT train on it
    (``~reference_in``; every reference when the keep masks are unknown). An example with no OUT reference
    uses the mean OUT loss over all examples instead; ``info["n_fallback"]`` counts them. Higher = member.

    >>> inputs = AttackInputs(target=np.array([[3.0], [3.0]]), reference=np.array([[[3.0], [-3.0]]]))
    >>> CalibratedLoss().score(inputs).round(3).tolist()   # the second example is hard for references
    [0.0, 3.0]
    """

    needs_reference = True
    online = False

    def score_with_info(self, inputs: AttackInputs) -> tuple[np.ndarray, dict[str, Any]]:
        self._check(inputs)
        out = inputs.out_mask()                           # (K, n)
        ref_loss = mean_loss(inputs.reference)            # (K, n)
        counts = out.sum(axis=0)
        total = counts.sum()
        if total == 0:
            raise ValueError("calibrated_loss needs at least one OUT reference signal; every reference "
                             "trained on every example")
        sums = np.where(out, ref_loss, 0.0).sum(axis=0)
        global_mean = sums.sum() / total
        ref_mean = np.where(counts > 0, sums / np.maximum(counts, 1), global_mean)
        scores = ref_mean - mean_loss(inputs.target)
        return scores, {"n_fallback": int((counts == 0).sum()),
                        "min_out_references": int(counts.min()) if counts.size else 0}
