"""Planted bugs: deliberately broken variants of the project's DP-SGD step, to prove the audit catches them.

Each mutant takes the :class:`~training.dp.stepper.Stepper` that :func:`training.dp.engine.make_stepper` built
and changes one thing while the claim (σ, q, T, δ and its ε) stays as stated — the mutation-testing counterpart
of ``make_stepper(_debug_disable_noise=True)``. Never use them for a real run.

* ``noise_0.8``: noise multiplier σ × 0.8.
* ``noise_without_C``: noise std σ instead of σ·C (a bug only when C ≠ 1).
* ``double_rate``: batches drawn at 2q (applied by the caller's sampler: :data:`RATE_SCALE`).
* ``unclipped_group``: the first parameter tensor's per-sample gradients are summed without clipping.
* ``reused_noise``: the noise generator is rewound before every step, so each step adds the same noise.
"""

from __future__ import annotations

from collections.abc import Callable


from training.dp.stepper import Stepper

__all__ = ["MUTANTS", "RATE_SCALE", "apply_mutant"]

RATE_SCALE = {"double_rate": 2.0}


def _noise(scale: float) -> Callable[[Stepper], None]:
    def apply(stepper: Stepper) -> None:
        stepper.dp_optimizer.noise_multiplier *= scale
    return apply


def _noise_without_c(stepper: Stepper) -> None:
    opt = stepper.dp_optimizer
    opt.noise_multiplier = opt.noise_multiplier / opt.max_grad_norm  # std σ·C/C = σ


def _unclipped_group(stepper: Stepper) -> None:
    opt = stepper.dp_optimizer
    first = opt.params[0]
    if hasattr(opt, "bk"):  # book-keeping: the clipped sums take one factor column per parameter
        bk = opt.bk
        original = bk.clipped_sums

        def clipped_sums(params, factors):
            factors = factors.clone()
            factors[:, 0] = 1.0
            return original(params, factors)
        bk.clipped_sums = clipped_sums
        return
    original_clip = opt.clip_and_accumulate

    def clip_and_accumulate() -> None:
        before = None if first.summed_grad is None else first.summed_grad.clone()
        raw = first.grad_sample.sum(0) if first.grad_sample is not None else None
        original_clip()
        if raw is not None:
            first.summed_grad = raw if before is None else before + raw
    opt.clip_and_accumulate = clip_and_accumulate


def _reused_noise(stepper: Stepper) -> None:
    opt = stepper.dp_optimizer
    gen = opt.generator
    state = gen.get_state()
    original = opt.add_noise

    def add_noise() -> None:
        gen.set_state(state)
        original()
    opt.add_noise = add_noise


MUTANTS: dict[str, Callable[[Stepper], None]] = {
    "noise_0.8": _noise(0.8),
    "noise_without_C": _noise_without_c,
    "double_rate": lambda stepper: None,
    "unclipped_group": _unclipped_group,
    "reused_noise": _reused_noise,
}


def apply_mutant(stepper: Stepper, name: str) -> None:
    """Break ``stepper`` as mutant ``name`` says (see the module docstring).

    Raises:
        ValueError: for an unknown name.
    """
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; choose one of {', '.join(MUTANTS)}")
    MUTANTS[name](stepper)
