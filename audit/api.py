"""The public Python API: every ``audit`` command as a function with the same name and arguments.

``audit train CONFIG --set k=v`` is ``audit.train(CONFIG, overrides={"k": v})``; ``audit epsilon RUN --sources
gradient_canaries`` is ``audit.epsilon(RUN, sources="gradient_canaries")``; and so on. Flags keep their names
(``--retrain-shadows`` → ``retrain_shadows``); ``--no-progress`` is ``progress=False``; ``--set`` (repeatable) is
``overrides``, a list of ``"key=value"`` strings (values read as YAML, as on the command line) or a
``{key: value}`` mapping (values set as given, never re-parsed: ``"no"`` stays a string). Each function returns the
typed result the command prints (:class:`~training.trainer.TrainResult`, :class:`~attacks.runner.AttackResult`,
:class:`~audit.bounds.runner.EpsilonReport`, :class:`~audit.reporting.ReportPaths`,
:class:`~audit.gating.GateResult`) and raises :class:`foundation.errors.UserError` (one line) on bad input, where the
command prints ``error: ...`` and exits with code 2. The click commands in :mod:`audit.commands` only parse
options, call these functions and print.

The steps' machinery lives in :mod:`audit.bounds` (ε lower bounds and the verdict), :mod:`audit.reporting` and
:mod:`audit.gating`; the functions here are plain functions with real signatures.

>>> import inspect, audit
>>> list(inspect.signature(audit.epsilon).parameters)[:2]
['run', 'alpha']
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foundation.config_io import Override, Overrides

if TYPE_CHECKING:
    from attacks.runner import AttackResult
    from audit.bounds.runner import EpsilonReport
    from audit.gating import GateResult
    from audit.reporting import ReportPaths
    from training.trainer import TrainResult

__all__ = ["train", "attack", "epsilon", "report", "gate", "as_overrides"]

PathLike = str | os.PathLike[str]


def as_overrides(overrides: Overrides) -> tuple[Override, ...]:
    """Typed ``(parts, value)`` overrides from a list of ``"key=value"`` strings (``--set``: values read as YAML
    scalars) or a ``{key: value}`` mapping (values kept as given, never re-parsed from text).

    >>> as_overrides({"data.root": "/data/set #2", "privacy.enabled": False})
    ((('data', 'root'), '/data/set #2'), (('privacy', 'enabled'), False))
    >>> as_overrides(["training.steps=10"])
    ((('training', 'steps'), 10),)
    """
    from foundation.config_io import to_overrides

    return to_overrides(overrides)


def train(config: PathLike, *, overrides: Overrides = None, variant: str | None = None,
          resume: bool = False, overwrite: bool = False, download: bool = False, progress: bool | None = False,
          command: str | None = None, warn: Any = None) -> TrainResult:
    """``audit train CONFIG``: train one model (DP or not) and write its run directory.

    Args:
        config: the experiment YAML. overrides: ``--set`` values. variant: ``--variant``.
        resume, overwrite, download: the flags of the same names. progress: show a progress bar (None: the
            config's ``training.progress``).
        command: the command line to record in the provenance (default: this call, spelt as the command).
        warn: called with each warning (e.g. a weak δ) before training starts.

    Returns:
        The :class:`~training.trainer.TrainResult` (run directory, manifest, metrics).
    """
    from audit.config import load_run_config, select_variant
    from training.distributed import process_group, world_from_env
    from training.trainer import train as _train

    from foundation.config_io import override_text

    extra = as_overrides(overrides) + (((("data", "download"), True),) if download else ())
    cfg = select_variant(load_run_config(config, extra), variant).train_config()
    if command is None:
        import shlex

        command = shlex.join(["audit", "train", str(config), *(a for o in extra for a in ("--set", override_text(o))),
                              *(["--variant", variant] if variant else [])])
    with process_group(world_from_env(), device=cfg.training.device):  # one process, or a torchrun rank
        return _train(cfg, resume=resume, overwrite=overwrite, progress=progress, command=command,
                      trust_code=True, warn=warn)  # the user's own config


def attack(run: PathLike, *, config: PathLike | None = None, variant: str | None = None,
           overrides: Overrides = None, retrain_shadows: bool = False,
           executor: str | None = None, ray_address: str | None = None, workers: int | None = None,
           ray_bind_host: str | None = None, progress: bool = False, trust_code: bool = False,
           note: Callable[[str], None] | None = None,
           train_fn: Callable[[Any, int], Any] | None = None) -> AttackResult:
    """``audit attack RUN``: membership inference with reference models trained by the run's own recipe, or
    (``train_fn``) by your own training code.

    Args:
        run: the run directory. config, variant: an experiment YAML whose ``attack:`` section to use.
        overrides: ``attack.*`` settings. retrain_shadows, executor, ray_address, workers, ray_bind_host,
            trust_code: as the command's flags (``ray_address`` and ``ray_bind_host`` imply ``executor="ray"``).
        progress: print progress messages. note: called with a note when the attacks were narrowed to what the
            run supports (a run without a training recipe).
        train_fn: for a run written by :class:`audit.OpacusAuditor` over an :class:`audit.AuditPool` (your own
            model class, which dp-audit cannot rebuild or retrain): ``train_fn(member_indices, seed) -> model``
            trains one reference model with the code that trained the target, on the items ``member_indices``
            (int64 positions in the dataset the ``AuditPool`` wraps) with randomness from ``seed`` (an int), and
            returns the trained ``torch.nn.Module`` (Opacus wrappers are unwrapped; the auditor puts it in eval
            mode and queries it on the recorded pool). Each call trains one model, so the executors are
            ``sequential`` (``auto``) and ``ray`` (Ray ships the function to its tasks); ``batched`` is for
            dp-audit's own recipes only. Every attack runs (LiRA, RMIA, ...); a wrong return value raises a
            one-line :class:`~foundation.errors.UserError` (:mod:`attacks.train_fn_runner`).

    Returns:
        The :class:`~attacks.runner.AttackResult` (``report`` is what ``attack.json`` holds).
    """
    from attacks.config import fit_to_run
    from attacks.runner import run_attack
    from audit.config import attacks_chosen, resolve_attack_config
    from training.run import has_recipe

    if not Path(run).is_dir():
        from foundation.errors import CheckpointError

        raise CheckpointError(f"run directory not found: {run}")
    given = as_overrides(overrides)
    if (ray_address is not None or ray_bind_host is not None) and executor is None:
        executor = "ray"
    extra = tuple((("attack", key), value) for key, value in
                  (("executor", executor), ("workers", workers), ("ray_address", ray_address),
                   ("ray_bind_host", ray_bind_host)) if value is not None)
    cfg = resolve_attack_config(run_dir=run, config_path=config, variant=variant, overrides=given + extra)
    if train_fn is not None:
        from attacks.train_fn_runner import attack_with_train_fn

        return attack_with_train_fn(run_dir=run, config=cfg, train_fn=train_fn, retrain_shadows=retrain_shadows,
                                    progress=progress)
    cfg, why = fit_to_run(cfg, has_recipe=has_recipe(run), attacks_chosen=attacks_chosen(config_path=config,
                                                                                          overrides=given))
    if why is not None and note is not None and not _user_model(run):  # such a run is refused in one line below
        note(why)
    return run_attack(run_dir=run, config=cfg, retrain_shadows=retrain_shadows, progress=progress,
                      trust_code=trust_code)


def _user_model(run: PathLike) -> bool:
    """Whether the run's manifest records the user's own model class (``OpacusAuditor``), which the command refuses."""
    from foundation.errors import UserError
    from training.models.build import USER_MODEL_PREFIX
    from training.run.manifest import read_manifest

    try:
        return str(read_manifest(run).model.arch).startswith(USER_MODEL_PREFIX)
    except UserError:
        return False


def epsilon(run: PathLike, *, alpha: float | None = None, sources: str | Sequence[str] | None = None,
            attack: str | None = None, guesses: str | None = None, config: PathLike | None = None,
            canaries: PathLike | None = None, references: PathLike | None = None, trust_code: bool = False,
            log: Callable[[str], None] | None = None) -> EpsilonReport:
    """``audit epsilon RUN``: empirical ε lower bounds and the verdict on the run's claim (writes ``epsilon.json``).

    Args:
        run: the run directory (``audit train``, ``audit import`` or :class:`audit.OpacusAuditor`).
        alpha, sources, attack, guesses: as the command's options (``sources``: a comma-separated string or a
            list). config: an experiment YAML whose ``epsilon:`` section gives the defaults.
        canaries, references: ``--canaries SECRET`` (the auditor's ``canary_secret.npz``) and ``--references DIR``.
        trust_code: ``--trust-code``. log: called with progress messages.

    Returns:
        The :class:`~audit.bounds.runner.EpsilonReport`: ``verdict.status`` (``VIOLATION`` / ``CONSISTENT`` /
        ...), every estimate with its counts, and ``path`` (``epsilon.json``).
    """
    from audit.config import resolve_epsilon_config
    from audit.bounds.runner import run_epsilon

    if sources is not None and not isinstance(sources, str):
        sources = ",".join(sources)
    cfg = resolve_epsilon_config(config_path=config, alpha=alpha, sources=sources, attack=attack, guesses=guesses,
                                 canaries=None if canaries is None else str(canaries),
                                 reference_dir=None if references is None else str(references))
    return run_epsilon(run_dir=run, config=cfg, trust_code=trust_code, log=log)


def report(run: PathLike, *, out: PathLike | None = None, pdf: bool = False, images: bool = True) -> ReportPaths:
    """``audit report RUN``: ``report.html``, ``report.md`` and ``report.json`` (``images=False`` is
    ``--no-images``). Returns the :class:`~audit.reporting.ReportPaths` (``report.glance.status`` is the verdict)."""
    from audit.reporting import write_report

    return write_report(run_dir=Path(run), out_dir=None if out is None else Path(out), pdf=pdf, load_images=images)


def gate(baseline: PathLike, candidate: PathLike, *, policy: PathLike, out: PathLike | None = None) -> GateResult:
    """``audit gate BASELINE CANDIDATE --policy P``: the CI regression gate.

    Returns the :class:`~audit.gating.GateResult` (``passed``, ``exit_code``: 0 pass, 1 a rule failed, and each
    rule's values); writes it as JSON to ``out`` when given (the command's default is ``gate.json``).
    """
    from audit.gating import evaluate_gate, write_gate_file

    result = evaluate_gate(baseline=Path(baseline), candidate=Path(candidate), policy=Path(policy))
    if out is not None:
        write_gate_file(Path(out), result)
    return result
