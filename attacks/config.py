"""Membership-inference attack settings (the ``attack:`` section of an experiment config; `audit attack`).

One strict, frozen model: unknown or misspelt keys are errors, attack names come from the registry
(:func:`attacks.registry.attack_names`). :func:`attacks.runner.run_attack` takes it as it is.

>>> cfg = AttackConfig(attacks=("loss", "lira_online"), n_reference=4)
>>> cfg.flip, cfg.shifts                  # default: the queries follow the target's training augmentation
('auto', 'auto')
>>> cfg.for_target(None).augmentations.names   # no recipe recorded (an import): the image as it is
('identity',)
>>> AttackConfig(flip=True).for_target(None).augmentations.names
('identity', 'hflip')
>>> fit_to_run(cfg, has_recipe=False, attacks_chosen=False)[0].attacks
('loss', 'attack_p')
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from attacks.ray_farm import RayOptions
from attacks.registry import attack_names, needs_reference
from attacks.signals import AugmentationSpec
from training.config import Strict
from foundation.io import sha256_bytes

__all__ = ["AttackConfig", "EXECUTION_ONLY", "reference_free_attacks", "fit_to_run"]

#: settings that change how fast results come, not what they are: left out of :meth:`AttackConfig.sha256`
EXECUTION_ONLY = ("executor", "workers", "device", "signal_batch_size", "max_models_per_batch", "ray_address",
                  "ray_cpus_per_task", "ray_gpus_per_task", "ray_max_retries", "ray_bind_host")


class AttackConfig(Strict):
    """Membership-inference attack settings (`audit attack`)."""

    n_reference: int = Field(16, ge=0, description="reference (shadow) models K: even, every pool example IN for "
                             "exactly K/2 of them; 0: only reference-free attacks")
    attacks: tuple[str, ...] = Field(default_factory=attack_names, description="attacks to run (registry names)")
    flip: bool | Literal["auto"] = Field("auto", description="query the horizontal flip too; auto: when the "
                                         "target trained with flips (training.augment.flip)")
    shifts: int | Literal["auto"] = Field("auto", description="query +-k pixel shifts; auto: the target's "
                                          "training.augment.crop_padding (0 when it trained without crops)")
    executor: Literal["auto", "batched", "sequential", "processes", "ray"] = Field(
        "auto", description="how reference models train: auto (batched when the recipe allows, else sequential), "
                            "batched, sequential, processes (several trainer processes on this machine, sharing "
                            "its GPU), or ray (tasks on a local Ray or a cluster)")
    workers: int | None = Field(None, ge=1, description="ray executor with a local Ray: CPUs it may use (None: all "
                                                        "cores); processes executor: worker processes (None: 4)")
    ray_address: str | None = Field(None, description="ray executor: 'auto' (this machine's cluster), 'host:port' "
                                                      "(a head's GCS), 'ray://host:port' (Ray Client), or None "
                                                      "(a private local Ray started in-process)")
    ray_bind_host: str = Field("127.0.0.1", description="ray executor with a local Ray: where its servers listen; "
                               "127.0.0.1 (this machine only) or an IP address of this machine other nodes reach "
                               "(they may then join it with ray start --address)")
    ray_cpus_per_task: float = Field(1.0, gt=0, description="ray executor: CPUs each task asks for")
    ray_gpus_per_task: float = Field(0.0, ge=0, description="ray executor: GPUs each task asks for")
    ray_max_retries: int = Field(3, ge=0, description="ray executor: re-runs of a failed or killed task")
    population: int | Literal["all"] = Field("all", description="population samples z for Attack-P and RMIA: "
                                             "'all' (every known non-member: the run's test split plus the images "
                                             "of its training split outside the pool; for an imported checkpoint "
                                             "the non-members held out at import; capped by population_memory_mb) "
                                             "or a number (a seeded subset of those)")
    population_memory_mb: float = Field(1024.0, gt=0.0, description="memory budget of the population signals and "
                                        "images (MiB): caps population 'all' and numbers alike by a seeded "
                                        "subset (attack.json's setup.population says when)")
    evaluation: Literal["target", "leave_one_out", "both"] = "target"
    n_bootstrap: int = Field(200, ge=0)
    rmia_gamma: float = Field(1.0, gt=0.0)
    rmia_offline_a: float | Literal["auto"] = Field("auto", description="offline RMIA's a in [0, 1], or 'auto': "
                                                    "chosen on the reference models (one as a pseudo-target)")
    rmia_ties: Literal["likelihood_ratio", "keep"] = Field("likelihood_ratio", description="RMIA: break ties "
                                                           "between equal pairwise fractions by the likelihood ratio")
    lira_location: Literal["median", "mean"] = Field("median", description="LiRA's centre of the reference "
                                                     "signals: median (the LiRA paper's code) or mean")
    top_vulnerable: int = Field(20, ge=0)
    seed: int = Field(0, description="seed of the keep masks, reference-model seeds, population draw, bootstrap")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where reference models train and run")
    signal_batch_size: int = Field(512, gt=0, description="examples per forward pass when computing signals")
    max_models_per_batch: int | None = Field(None, gt=0, description="batched executor: most models at once "
                                             "(None: as many as fit in memory)")

    @model_validator(mode="after")
    def _check(self) -> AttackConfig:
        valid = attack_names()
        unknown = [a for a in self.attacks if a not in valid]
        if unknown:
            raise ValueError(f"attack.attacks: unknown attack(s) {unknown}; valid: {', '.join(valid)}")
        if isinstance(self.shifts, int) and self.shifts < 0:
            raise ValueError(f"attack.shifts must be >= 0 or 'auto', got {self.shifts}")
        self._check_n_reference()
        try:
            self.ray_options()
        except ValueError as exc:
            raise ValueError(f"attack.ray_*: {exc}") from None
        if self.population != "all" and (isinstance(self.population, bool) or self.population < 0):
            raise ValueError(f"attack.population must be 'all' or an integer >= 0; got {self.population!r}")
        if self.rmia_offline_a != "auto" and not 0.0 <= self.rmia_offline_a <= 1.0:
            raise ValueError(f"attack.rmia_offline_a must be 'auto' or a number in [0, 1]; got {self.rmia_offline_a!r}")
        return self

    def _check_n_reference(self) -> None:
        """K, checked here once: 0 (reference-free attacks only) or an even number >= 2, since every pool example is
        IN for exactly half of the reference models; and >= 2 whenever an attack or leave-one-out needs them.

        >>> AttackConfig(n_reference=3)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        pydantic_core._pydantic_core.ValidationError: ...attack.n_reference must be an even number >= 2 ...got 3...
        """
        k = self.n_reference
        if k % 2:
            raise ValueError(f"attack.n_reference must be an even number >= 2 (each example is IN for exactly half "
                             f"of the reference models), or 0 for reference-free attacks only; got {k}")
        if k == 0 and self.needs_references:
            need = [a for a in self.attacks if needs_reference(a)]
            raise ValueError(f"attack.n_reference must be an even number >= 2: attack(s) "
                             f"{', '.join(need) or '(leave-one-out evaluation)'} need reference models, but "
                             f"attack.n_reference is 0; set it to an even number >= 2 or drop those attacks")

    def ray_options(self) -> RayOptions:
        """The Ray settings of the ``ray`` executor."""
        return RayOptions(address=self.ray_address, cpus_per_task=float(self.ray_cpus_per_task),
                          gpus_per_task=float(self.ray_gpus_per_task), max_retries=int(self.ray_max_retries),
                          local_cpus=self.workers, bind_host=self.ray_bind_host)

    def attack_params(self) -> dict[str, object]:
        """The settings :func:`attacks.registry.configured_attack` takes."""
        return {"gamma": self.rmia_gamma, "offline_a": self.rmia_offline_a, "ties": self.rmia_ties,
                "lira_location": self.lira_location}

    @property
    def augmentations(self) -> AugmentationSpec:
        """The augmented queries of every example (``auto`` settings resolved first: :meth:`for_target`)."""
        if self.flip == "auto" or self.shifts == "auto":
            raise ValueError("attack.flip/shifts are 'auto': resolve them with for_target(the target's recipe)")
        return AugmentationSpec(flip=bool(self.flip), shifts=int(self.shifts))

    def for_target(self, augment: Mapping[str, Any] | None) -> AttackConfig:
        """``flip``/``shifts`` of ``auto`` resolved from the target's training augmentation (its config's
        ``training.augment`` mapping, or None when no recipe was recorded): query the target as it was trained
        (LiRA queries in distribution; a flip a model never saw only blurs its signal). No recipe: the image as
        it is."""
        augment = augment or {}
        update: dict[str, object] = {}
        if self.flip == "auto":
            update["flip"] = bool(augment.get("flip", False))
        if self.shifts == "auto":
            update["shifts"] = int(augment.get("crop_padding", 0) or 0)
        return self.model_copy(update=update) if update else self

    def queries_from(self, has_recipe: bool) -> str:
        """Where the query augmentations came from, for ``attack.json``'s setup."""
        auto = [k for k in ("flip", "shifts") if getattr(self, k) == "auto"]
        if not auto:
            return "set (attack.flip, attack.shifts)"
        src = "the target's training.augment" if has_recipe else "no recipe recorded: identity"
        return f"{', '.join('attack.' + k for k in auto)}: auto ({src})"

    @property
    def needs_references(self) -> bool:
        """Whether reference models are needed (an attack needs them, or leave-one-out evaluation)."""
        return self.evaluation != "target" or any(needs_reference(a) for a in self.attacks)

    def sha256(self) -> str:
        """sha256 of the settings that determine the results (:data:`EXECUTION_ONLY` left out).

        ``attack.json`` records it; results are stale when it changes.
        """
        data = self.model_dump(exclude=set(EXECUTION_ONLY))
        return sha256_bytes(json.dumps(data, sort_keys=True, default=list).encode("utf-8"))


def reference_free_attacks() -> tuple[str, ...]:
    """The registry's attacks that need no reference models, in registry order."""
    return tuple(a for a in attack_names() if not needs_reference(a))


def fit_to_run(config: AttackConfig, *, has_recipe: bool, attacks_chosen: bool) -> tuple[AttackConfig, str | None]:
    """The settings to use on a run, and a note when they were narrowed.

    A run without a training recipe (an imported checkpoint: no ``config.yaml``) cannot have reference models
    trained for it. Unless the user chose the attacks (``attacks_chosen``: a config file or ``attack.attacks``
    set explicitly), only the reference-free attacks run, evaluated on the target.

    Returns:
        ``(config, note)``; ``note`` is None when nothing changed.
    """
    if has_recipe or attacks_chosen:
        return config, None
    free = reference_free_attacks()
    narrowed = config.model_copy(update={"attacks": free, "evaluation": "target"})
    return narrowed, f"has no training recipe (config.yaml): running only {', '.join(free)}"
