"""The ``continual_pretrain`` recipe: public non-DP pre-training, then private DP training (Bu et al. 2024).

Bu, Zhang, Hong, Zha, Karypis, "Pre-training Differentially Private Models with Limited Public Data",
NeurIPS 2024: a little public data, trained on without noise, carries the model through the early phase in
which DP noise hurts most (tr(H) is large); DP training on the private data continues from there.

Phases:

1. ``public`` (dp=false): ``optim.name`` with ``continual.public_lr`` and a constant schedule, on
   ``continual.public`` (images equal to a private pool image are dropped first, see
   :mod:`training.recipes.public`), until the switch rule fires (:mod:`training.recipes.switch`). The rule's
   evaluations use public data only: the public validation loss (``plateau``), or the decelerator with tr(H)
   estimated on a fixed batch of ``training.hessian.batch_size`` public examples (the public validation split
   when there is one, else public training images) with ``training.hessian.probes`` probes, and the private
   phase's σ, B and c (``decelerator``). The logged tr(H) curve (``training.hessian.every``) is measured, as in
   every recipe, on the same fixed batch of test images (:func:`~training.recipes.common.make_monitor`), so
   continual, from-scratch and non-DP arms are compared on the same held-out images.
2. ``private`` (dp=privacy.enabled): ``optim`` on the members, T_priv steps (``training.steps``, or what is left
   of it after the public phase with ``continual.count_public_steps``), σ calibrated for q = B/n and T_priv alone:
   the public phase is not accounted (it never touches private data). The optimizer state crosses the switch as
   ``continual.optimizer_state`` says. When the public data has other classes, the classifier is replaced (seeded
   random initialisation) at the switch and its optimizer state starts fresh.

The switch step, its reason and every evaluation are part of the saved state, so a run resumed after the switch
continues the private phase, and one resumed before it decides exactly as the uninterrupted run would.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from training.config import PrivacyConfig
from training.dp.rng import Stream, derive_seed
from foundation.errors import ConfigError
from training.evaluate import mean_loss
from training.hessian import decelerator, model_hessian_trace
from training.run.manifest import PhaseInfo
from training.models import build_model
from training.recipes.common import (HELD_OUT_SEED, RunSetup, calibrate_sigma, held_out_batch,
                                     make_gradient_canaries, make_monitor, phase_seed)
from training.phases import PhaseSpec
from training.recipes.public import load_public
from training.loop import NextPhase, RunContext
from training.recipes.switch import Evaluation, rule_from_config

__all__ = ["ContinualRecipe"]


class ContinualRecipe:
    """Public phase, switch rule, private phase (see the module docstring).

    Raises:
        ConfigError: an impossible combination (plateau without public validation data, decelerator without DP,
            a step budget the public phase could use up, a public batch larger than the public set).
        DataError: public images of another size, or no public image left after removing the private ones.
    """

    def __init__(self, setup: RunSetup, ctx: RunContext) -> None:
        cfg = setup.cfg
        self.setup, self.ctx = setup, ctx
        tc, pc, cc = cfg.training, cfg.privacy, cfg.training.continual
        self.cfg, self.cc = cfg, cc
        self.rule = rule_from_config(cc)
        self.public = load_public(cc.public, private=setup.pool.images)
        if cc.switch == "plateau" and (self.public.val is None or len(self.public.val) == 0):
            raise ConfigError("continual.switch: plateau needs public validation data; set "
                              "training.continual.public.test_split")
        if cc.switch == "decelerator" and not pc.enabled:
            raise ConfigError("continual.switch: decelerator needs privacy.enabled: true (it uses the private "
                              "phase's noise multiplier)")
        self.public_cap = min(cc.switch_steps, cc.max_public_steps) if cc.switch == "steps" else cc.max_public_steps
        self.budget = setup.private_steps()
        if cc.count_public_steps and self.budget - self.public_cap < 1:
            raise ConfigError(f"training.steps={self.budget} counts the public steps, but the public phase may take "
                              f"up to {self.public_cap}; raise training.steps or lower continual.max_public_steps")
        public_batch = cc.public_batch_size or tc.batch_size
        if public_batch > len(self.public.train):
            raise ConfigError(f"the public batch ({public_batch}) is larger than the {len(self.public.train)} public "
                              "images; set training.continual.public_batch_size")
        self.public_classes = len(self.public.train.classes)
        built = build_model(cfg.model, num_classes=self.public_classes, input_shape=setup.input_shape, seed=tc.seed,
                            trust_code=setup.trust_code)
        self.model = built.module.to(setup.device)
        self.model_cfg = cfg.model
        self.model_notes = list(built.notes)
        self.q = tc.batch_size / setup.n
        self._sigmas: dict[int, float] = {}
        self.public_spec = PhaseSpec(
            name="public", dp=False, dataset=self.public.dataset, x=self.public.train.x, y=self.public.train.y,
            index=None, batch_size=public_batch, steps=max(1, self.public_cap), sigma=None,
            privacy=PrivacyConfig(enabled=False, sampling="shuffle"),
            optim=cfg.optim.model_copy(update={"lr": cc.public_lr or cfg.optim.lr, "schedule": "constant"}),
            sampler_seed=phase_seed(tc.seed, 0), training=tc)
        self._eval_batch = None
        if cc.switch == "decelerator":
            rule_images = self.public.val if (self.public.val is not None and len(self.public.val)) else (
                self.public.train)
            self._eval_batch = held_out_batch(rule_images, size=tc.hessian.batch_size, seed=HELD_OUT_SEED,
                                              device=setup.device)
        fixed_sigma = self.sigma_for(0) if (pc.enabled and not cc.count_public_steps) else None
        before, what = setup.pool.test, "data.test_split"
        if self.public_classes != setup.num_classes and tc.hessian.every:  # the public head cannot score test labels
            before, what = (self.public.val, "training.continual.public.test_split") if (
                self.public.val is not None and len(self.public.val)) else (self.public.train, "public images")
            setup.notes.append(f"tr(H) before the switch is measured on {what} (the public head has other classes "
                               "than the test split); after it on the test split")
        ctx.hessian = make_monitor(cfg, self.model, before, sigma=fixed_sigma, batch_size=tc.batch_size,
                                   device=setup.device, what=what)
        if self.public.dropped:
            setup.notes.append(f"{self.public.dropped} public image(s) equal to private pool images were dropped "
                               "from the public phase")
        ctx.recipe_state.setdefault("evaluations", [])

    # ------------------------------------------------------------------------------------------ budget

    def private_steps(self, switch_step: int) -> int:
        return self.budget - switch_step if self.cc.count_public_steps else self.budget

    def sigma_for(self, switch_step: int) -> float | None:
        """σ of the private phase if the switch happens after ``switch_step`` public steps (cached)."""
        if not self.cfg.privacy.enabled:
            return None
        steps = self.private_steps(switch_step)
        if steps not in self._sigmas:
            self._sigmas[steps] = calibrate_sigma(self.cfg, sample_rate=self.q, steps=steps, delta=self.setup.delta)
        return self._sigmas[steps]

    def total_steps(self) -> int:
        return self.budget if self.cc.count_public_steps else self.public_cap + self.budget

    # ------------------------------------------------------------------------------------------- rules

    def _evaluate(self, step: int, model: nn.Module) -> Evaluation:
        device = self.setup.device
        if self.cc.switch == "plateau":
            loss = mean_loss(model, self.public.val, device=device)
            self.ctx.logger.scalar("continual/public_val_loss", loss, self.ctx.global_step)
            return Evaluation(step=step, value=loss)
        hc = self.cfg.training.hessian
        gen = torch.Generator(device=device)
        gen.manual_seed(derive_seed(self.cfg.training.seed, Stream.HESSIAN, step))
        x, y = self._eval_batch
        est = model_hessian_trace(model, x, y, probes=hc.probes, generator=gen)
        sigma = self.sigma_for(step)
        dec = decelerator(sigma=sigma, trace_h=est.mean, batch_size=self.cfg.training.batch_size,
                          clip_norm=self.cfg.privacy.max_grad_norm)
        for tag, v in (("trace_h", est.mean), ("decelerator", dec)):
            self.ctx.logger.scalar(f"continual/{tag}", v, self.ctx.global_step)
        return Evaluation(step=step, value=dec, extra=(("trace_h", est.mean), ("trace_h_stderr", est.stderr),
                                                      ("sigma", sigma)))

    def _decide(self, step: int, model: nn.Module) -> str | None:
        evals = self.ctx.recipe_state["evaluations"]
        if self.rule.evaluates_at(step):
            evals.append(self._evaluate(step, model).as_dict())
        return self.rule.decide(step=step, evaluations=[Evaluation.from_dict(e) for e in evals])

    # ------------------------------------------------------------------------------------------ phases

    def _switch_step(self, completed: list[dict[str, Any]]) -> int:
        return completed[0]["steps"] if completed and completed[0]["name"] == "public" else 0

    def _private_spec(self, switch_step: int) -> PhaseSpec:
        cfg, tc = self.cfg, self.cfg.training
        images = self.setup.pool.images
        return PhaseSpec(
            name="private" if cfg.privacy.enabled else "non-private", dp=cfg.privacy.enabled,
            dataset=cfg.data.dataset, x=images.x, y=images.y, index=self.setup.members, batch_size=tc.batch_size,
            steps=self.private_steps(switch_step), sigma=self.sigma_for(switch_step), privacy=cfg.privacy,
            optim=cfg.optim, sampler_seed=phase_seed(tc.seed, 1), carry=self.cc.optimizer_state,
            training=tc)

    def _prepare_private(self, switch_step: int):
        def prepare(model: nn.Module) -> None:
            if self.public_classes != self.setup.num_classes:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(derive_seed(self.cfg.training.seed, Stream.HEAD, switch_step))
                    model.reset_classifier(self.setup.num_classes)
                model.to(self.setup.device)
            if self.ctx.hessian is not None:  # a hook-free template of the (maybe new) architecture
                self.ctx.hessian = make_monitor(self.cfg, model, self.setup.pool.test,
                                                sigma=self.sigma_for(switch_step),
                                                batch_size=self.cfg.training.batch_size, device=self.setup.device,
                                                what="data.test_split")
            self.ctx.canaries = make_gradient_canaries(self.cfg, model)
        return prepare

    def next_phase(self, completed: list[dict[str, Any]]) -> NextPhase | None:
        names = [c["name"] for c in completed]
        if not names and self.rule.decide(step=0, evaluations=[]) is None:
            return NextPhase(spec=self.public_spec, decide=self._decide,
                             write_init=not self.cfg.privacy.enabled)
        if names in ([], ["public"]):
            s = self._switch_step(completed)
            self.ctx.recipe_state["switch_step"] = s
            self.ctx.recipe_state["switch_reason"] = completed[0]["reason"] if completed else (
                self.rule.decide(step=0, evaluations=[]))
            return NextPhase(spec=self._private_spec(s), prepare=self._prepare_private(s),
                             write_init=self.cfg.privacy.enabled)
        return None

    def phase_infos(self, completed: list[dict[str, Any]]) -> list[PhaseInfo]:
        s = self._switch_step(completed)
        specs = {"public": self.public_spec}
        out = []
        for c in completed:
            spec = specs.get(c["name"]) or self._private_spec(s)
            out.append(spec.phase_info(steps_done=c["steps"], frozen=c["frozen"]))
        return out

    def metrics(self, completed: list[dict[str, Any]]) -> dict[str, Any]:
        rs = self.ctx.recipe_state
        s = self._switch_step(completed)
        return {"continual": {
            "switch_rule": self.cc.switch, "switch_step": s, "switch_reason": rs.get("switch_reason"),
            "public_steps": s, "private_steps": sum(c["steps"] for c in completed if c["name"] != "public"),
            "private_noise_multiplier": self.sigma_for(s), "public_dataset": self.public.dataset,
            "public_size": len(self.public.train), "public_dropped": self.public.dropped,
            "optimizer_state": self.cc.optimizer_state, "evaluations": list(rs.get("evaluations", []))}}
