"""The ``finetune`` recipe: DP linear probing, DP full fine-tuning, or both in sequence (DP-LP-FFT).

Ke, Hou, Fanti, Oh, "On the Convergence of Differentially-Private Fine-tuning: To Linearly Probe or to Fully
Fine-tune?" (arXiv:2402.18905, 2024): DP full fine-tuning (FFT) from a pre-trained backbone with a freshly
initialised head distorts the backbone's features; DP linear probing (LP, head only) first aligns the head,
after which FFT helps; the ε budget is split between the two phases (:mod:`training.recipes.budget`).

Starting point (``training.finetune.checkpoint``): a run directory (architecture from its manifest, weights
checked against its sha256) or a weights file (architecture from ``model``). The head:

* ``keep``: the checkpoint's classifier (the data must have the checkpoint's number of classes);
* ``zero``: weight and bias zero (every class scores 0 at the start);
* ``random``: a fresh, seeded initialisation.

When the number of classes differs, the classifier is always a new one (``keep`` is then an error).

Phases: ``lp`` trains only the classifier (the backbone stays bit-identical); ``fft`` trains every parameter
that ``model.freeze`` leaves trainable. With ``lp_fft`` both run in that order, each with a fresh optimizer, LP
at ``finetune.lp_lr``. The accountant composes the DP phases into the claim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.config import ModelConfig
from training.errors import CheckpointError, ConfigError, DataError
from training.manifest import PhaseInfo, read_manifest, verify_weights
from training.models import build_model, load_weights_file
from training.models.weights import strip_prefix
from training.recipes.budget import PhaseBudget, split_budget, split_steps
from training.recipes.common import RunSetup, make_gradient_canaries, make_monitor, phase_seed
from training.recipes.phases import PhaseSpec, set_trainable, zero_head
from training.recipes.runner import NextPhase, RunContext
from training.io import sha256_file

__all__ = ["FinetuneRecipe", "resolve_checkpoint", "head_parameter_names"]


def head_parameter_names(model: nn.Module) -> list[str]:
    """Names of the classifier's parameters (``model.head``) in ``model.named_parameters()``."""
    ids = {id(p) for p in model.head.parameters()}
    return [n for n, p in model.named_parameters() if id(p) in ids]


def resolve_checkpoint(path: str | None, model_cfg: ModelConfig) -> tuple[ModelConfig, dict[str, Any]]:
    """The model config that rebuilds the checkpoint (with ``pretrained`` pointing at its weights) and a
    description of the source for the manifest.

    Raises:
        ConfigError: no checkpoint given.
        CheckpointError: the path is missing, or a run directory whose weights fail their sha256.
    """
    if path is None:
        raise ConfigError("training.recipe: finetune needs training.finetune.checkpoint (a run directory or a "
                          "weights file)")
    p = Path(path)
    if p.is_dir():
        manifest = read_manifest(p)
        weights = verify_weights(p, manifest)
        m = manifest.model
        cfg = ModelConfig(arch=m.arch, kwargs=dict(m.kwargs), cifar_stem=m.cifar_stem, fix_batchnorm=m.fix_batchnorm,
                          normalize_mean=m.normalize_mean, normalize_std=m.normalize_std, pretrained=str(weights),
                          freeze=model_cfg.freeze)
        source = {"kind": "run", "path": str(p), "weights_sha256": m.weights_sha256, "run_name": manifest.run_name,
                  "num_classes": m.num_classes, "input_shape": list(m.input_shape),
                  "epsilon": manifest.privacy.epsilon, "dataset": manifest.data.dataset}
        return cfg, source
    if p.is_file():
        return (model_cfg.model_copy(update={"pretrained": str(p)}),
                {"kind": "weights", "path": str(p), "weights_sha256": sha256_file(p)})
    raise CheckpointError(f"training.finetune.checkpoint {path!r} does not exist; give a run directory or a "
                          "weights file")


def _same_head(model: nn.Module, model_cfg: ModelConfig, source: dict[str, Any]) -> bool:
    """Whether the checkpoint's classifier fits the model's (same number of classes)."""
    if "num_classes" in source:
        return int(source["num_classes"]) == int(model.num_classes)
    state = strip_prefix(load_weights_file(model_cfg.pretrained), "net.")
    key = f"{model.head_prefix()}.weight"
    return key in state and tuple(state[key].shape) == tuple(model.head.weight.shape)


class FinetuneRecipe:
    """DP-LP, DP-FFT or DP-LP-FFT from a checkpoint (see the module docstring).

    Raises:
        ConfigError: no checkpoint, ``head_init: keep`` with other classes, gradient canaries with two DP
            phases, an impossible budget split.
        CheckpointError, DataError: a checkpoint that is missing, corrupt, or made for other image sizes.
    """

    def __init__(self, setup: RunSetup, ctx: RunContext) -> None:
        cfg = setup.cfg
        self.setup, self.ctx, self.cfg = setup, ctx, cfg
        tc, pc, ft = cfg.training, cfg.privacy, cfg.training.finetune
        self.ft = ft
        model_cfg, self.source = resolve_checkpoint(ft.checkpoint, cfg.model)
        shape = self.source.get("input_shape")
        if shape is not None and tuple(shape) != setup.input_shape:
            raise DataError(f"the checkpoint was trained on {tuple(shape)} inputs but the data are "
                            f"{setup.input_shape}; set data.image_size: {shape[1]}")
        built = build_model(model_cfg, num_classes=setup.num_classes, input_shape=setup.input_shape, seed=tc.seed,
                            trust_code=setup.trust_code)
        model = built.module.to(setup.device)
        same = _same_head(model, model_cfg, self.source)
        if ft.head_init == "keep" and not same:
            raise ConfigError("finetune.head_init: keep needs the checkpoint's classes, but the data have "
                              f"{setup.num_classes} classes; use head_init: zero or random")
        if ft.head_init == "zero":
            zero_head(model)
        elif ft.head_init == "random" or not same:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(tc.seed) + 0x4845)
                model.reset_classifier(setup.num_classes)
            model.to(setup.device)
        self.model = model
        self.model_cfg = model_cfg.model_copy(update={"pretrained": None})
        self.model_notes = list(built.notes) + [f"fine-tuned from {self.source['path']} (head_init={ft.head_init})"]
        self.head = head_parameter_names(model)
        self.backbone_trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        steps = setup.private_steps()
        q = tc.batch_size / setup.n
        if pc.enabled:
            plan = split_budget(strategy=ft.strategy, split_by=ft.split_by, lp_fraction=ft.lp_fraction,
                                total_steps=steps, sample_rate=q, delta=setup.delta, accountant=pc.accountant,
                                target_epsilon=pc.target_epsilon, noise_multiplier=pc.noise_multiplier,
                                lp_steps_fraction=ft.lp_steps_fraction)
        elif ft.strategy == "lp_fft":
            t_lp, t_fft = split_steps(steps, ft.lp_steps_fraction or ft.lp_fraction)
            plan = [PhaseBudget(name="lp", steps=t_lp, noise_multiplier=0.0),
                    PhaseBudget(name="fft", steps=t_fft, noise_multiplier=0.0)]
        else:
            plan = [PhaseBudget(name=ft.strategy, steps=steps, noise_multiplier=0.0)]
        if tc.gradient_canaries.count and pc.enabled and len(plan) > 1:
            raise ConfigError("training.gradient_canaries need a single DP phase; use finetune.strategy lp or fft")
        images = setup.pool.images
        self.specs = [PhaseSpec(
            name=b.name, dp=pc.enabled, dataset=cfg.data.dataset, x=images.x, y=images.y, index=setup.members,
            batch_size=tc.batch_size, steps=b.steps, sigma=b.noise_multiplier if pc.enabled else None, privacy=pc,
            optim=cfg.optim.model_copy(update={"lr": ft.lp_lr or cfg.optim.lr}) if b.name == "lp" else cfg.optim,
            sampler_seed=phase_seed(tc.seed, i),
            trainable=tuple(self.head if b.name == "lp" else self.backbone_trainable))
            for i, b in enumerate(plan)]
        ctx.hessian = None  # made per phase in prepare (its template must match the phase's trainable set)

    def total_steps(self) -> int:
        return sum(s.steps for s in self.specs)

    def _prepare(self, spec: PhaseSpec):
        def prepare(model: nn.Module) -> None:
            set_trainable(model, spec.trainable)
            self.ctx.canaries = make_gradient_canaries(self.cfg, model) if spec.dp else None
            self.ctx.hessian = make_monitor(self.cfg, model, self.setup.pool.test, sigma=spec.sigma,
                                            batch_size=spec.batch_size, device=self.setup.device,
                                            what="data.test_split")
        return prepare

    def next_phase(self, completed: list[dict[str, Any]]) -> NextPhase | None:
        i = len(completed)
        if i >= len(self.specs):
            return None
        spec = self.specs[i]
        return NextPhase(spec=spec, prepare=self._prepare(spec), write_init=i == 0)

    def phase_infos(self, completed: list[dict[str, Any]]) -> list[PhaseInfo]:
        return [self.specs[c["index"]].phase_info(steps_done=c["steps"], frozen=c["frozen"]) for c in completed]

    def metrics(self, completed: list[dict[str, Any]]) -> dict[str, Any]:
        ft = self.ft
        return {"finetune": {
            "strategy": ft.strategy, "split_by": ft.split_by if ft.strategy == "lp_fft" else None,
            "lp_fraction": ft.lp_fraction if ft.strategy == "lp_fft" else None, "head_init": ft.head_init,
            "source": self.source, "head_parameters": self.head,
            "phases": [{"name": s.name, "steps": s.steps, "noise_multiplier": s.sigma} for s in self.specs]}}
