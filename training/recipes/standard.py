"""The ``standard`` recipe: one phase on the private members, DP-SGD (or plain SGD when privacy is off)."""

from __future__ import annotations

from typing import Any

from training.run.manifest import PhaseInfo
from training.models import build_model
from training.recipes.common import RunSetup, calibrate_sigma, init_from_members, make_gradient_canaries, make_monitor
from training.phases import PhaseSpec
from training.loop import NextPhase, RunContext

__all__ = ["StandardRecipe"]


class StandardRecipe:
    """One phase: ``training.steps`` steps of batch ``training.batch_size`` on the members.

    σ is ``privacy.noise_multiplier`` or calibrated to ``privacy.target_epsilon`` for q = B/n and T steps.
    """

    def __init__(self, setup: RunSetup, ctx: RunContext) -> None:
        cfg = setup.cfg
        tc, pc = cfg.training, cfg.privacy
        built = build_model(cfg.model, num_classes=setup.num_classes, input_shape=setup.input_shape, seed=tc.seed,
                            trust_code=setup.trust_code)
        self.model = built.module.to(setup.device)
        self.model_cfg = cfg.model
        self.model_notes = list(built.notes)
        note = init_from_members(setup, self.model)
        if note is not None:
            self.model_notes.append(note)
        steps = setup.private_steps()
        q = tc.batch_size / setup.n
        sigma = calibrate_sigma(cfg, sample_rate=q, steps=steps, delta=setup.delta) if pc.enabled else None
        images = setup.pool.images
        self.spec = PhaseSpec(
            name="private" if pc.enabled else "non-private", dp=pc.enabled, dataset=cfg.data.dataset,
            x=images.x, y=images.y, index=setup.members, batch_size=tc.batch_size, steps=steps, sigma=sigma,
            privacy=pc, optim=cfg.optim,
            sampler_seed=tc.seed, training=tc)
        ctx.canaries = make_gradient_canaries(cfg, self.model)
        ctx.hessian = make_monitor(cfg, self.model, setup.pool.test, sigma=sigma, batch_size=tc.batch_size,
                                   device=setup.device, what="data.test_split")

    def total_steps(self) -> int:
        return self.spec.steps

    def next_phase(self, completed: list[dict[str, Any]]) -> NextPhase | None:
        return None if completed else NextPhase(spec=self.spec, write_init=True)

    def phase_infos(self, completed: list[dict[str, Any]]) -> list[PhaseInfo]:
        return [self.spec.phase_info(steps_done=c["steps"], frozen=c["frozen"]) for c in completed]

    def metrics(self, completed: list[dict[str, Any]]) -> dict[str, Any]:
        return {}
