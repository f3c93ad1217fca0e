"""`audit run CONFIG`: train -> attack -> epsilon -> transfer -> report for every variant, resumable.

Every step reads and writes files in the run directory and is skipped when its outputs are complete and match
their inputs: training by its manifest and config hash (an interrupted training resumes from its saved state);
after training the run is opened once (:func:`training.run.open_run`) and that verified run is passed to every
later step, whose outputs are current by one rule (:mod:`training.run.freshness`): attacks and epsilon by the
inputs recorded in ``attack.json``/``epsilon.json``, transfer and the report by the digests kept in
``pipeline.json``. So an interrupted pipeline, run again, redoes only what is missing.

CONFIG is the user's own experiment file and its run directories are written from it by the train step, so
every step runs with ``trust_code=True`` (an import-path ``model.arch`` in CONFIG is built, as by
``audit train``); auditing a run directory someone else made is ``audit attack``/``epsilon``/``transfer``, which
refuse such code unless given ``--trust-code``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attacks.resolution import not_resolvable, resolvable
from audit.config import RunConfig, select_variant, variant_names
from foundation.errors import ConfigError
from foundation.files import (ATTACK_FILE, EPSILON_FILE, PIPELINE_FILE, REPORT_HTML_FILE, REPORT_JSON_FILE,
                              REPORT_MD_FILE, TRANSFER_FILE)
from foundation.io import read_json, sha256_file, write_json
from training.run import METRICS_FILE, VerifiedRun, inputs_digest, open_run
from training.trust import CodeTrust

__all__ = ["STEPS", "StepRecord", "VariantResult", "preflight", "run_pipeline"]

STEPS = ("train", "attack", "epsilon", "transfer", "report")
Log = Callable[[str], None]


@dataclass
class StepRecord:
    step: str
    status: str  # "ran", "skipped (complete)", "not configured"
    seconds: float = 0.0
    detail: str = ""


@dataclass
class VariantResult:
    variant: str | None
    run_dir: Path
    steps: list[StepRecord] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def _file_shas(run_dir: Path, *names: str) -> dict[str, str | None]:
    """sha256 of each named file (None when absent): the step-specific part of a ledger key."""
    return {n: sha256_file(run_dir / n) if (run_dir / n).is_file() else None for n in names}


def _ledger(run_dir: Path) -> dict[str, Any]:
    path = run_dir / PIPELINE_FILE
    if not path.is_file():
        return {}
    try:
        data = read_json(path, what="pipeline ledger")
    except Exception:  # an unreadable ledger only means the steps it covers are redone
        return {}
    return data if isinstance(data, dict) else {}


def _mark(run_dir: Path, step: str, key: str) -> None:
    data = _ledger(run_dir)
    data[step] = {"key": key, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_json(run_dir / PIPELINE_FILE, data)


def _timed(records: list[StepRecord], step: str, fn: Callable[[], str]) -> None:
    t0 = time.perf_counter()
    detail = fn()
    records.append(StepRecord(step, "ran", time.perf_counter() - t0, detail or ""))


def _run_variant(cfg: RunConfig, *, steps: tuple[str, ...], retrain_shadows: bool, progress: bool,
                 command: str | None, log: Log, warn: Log | None) -> VariantResult:
    from foundation.io import check_output_dir
    from foundation.lock import run_lock

    check_output_dir(cfg.run_dir(), what="run directory")
    with run_lock(cfg.run_dir(), command=command):  # the steps below take it again (nested, same process)
        return _run_steps(cfg, steps=steps, retrain_shadows=retrain_shadows, progress=progress, command=command,
                          log=log, warn=warn)


def _run_steps(cfg: RunConfig, *, steps: tuple[str, ...], retrain_shadows: bool, progress: bool,
               command: str | None, log: Log, warn: Log | None) -> VariantResult:
    from training.trainer import train

    run_dir = cfg.run_dir()
    res = VariantResult(cfg.variant, run_dir)
    label = cfg.name
    run: VerifiedRun | None = None
    progress = progress and cfg.train_config().training.progress  # the config's `training.progress: false` holds

    if "train" in steps:
        t0 = time.perf_counter()
        tr = train(cfg.train_config(), resume=True, progress=progress, command=command, trust_code=True,
                   warn=warn)
        status = "skipped (complete)" if tr.already_complete else "ran"
        detail = f"resumed at step {tr.resumed_from}" if tr.resumed_from else ""
        res.steps.append(StepRecord("train", status, time.perf_counter() - t0, detail))
        log(f"[{label}] train: {status} {detail}".rstrip())
        # the manifest the trainer just wrote or read, and the pool it trained on: nothing is parsed twice
        run = VerifiedRun(tr.run_dir, tr.manifest, code=CodeTrust(trust_code=True), built_pool=tr.pool)
    if run is None:
        run = open_run(run_dir, trust_code=True, verify=False)  # once; each part is verified on first use
    if "attack" in steps and cfg.attack.attacks:
        from attacks.runner import attack_is_complete, run_attack

        if attack_is_complete(run, cfg.attack) and not retrain_shadows:
            res.steps.append(StepRecord("attack", "skipped (complete)"))
        else:
            _timed(res.steps, "attack", lambda: str(run_attack(run_dir=run, config=cfg.attack,
                                                               retrain_shadows=retrain_shadows,
                                                               progress=progress) and ""))
        log(f"[{label}] attack: {res.steps[-1].status}")

    if "epsilon" in steps and cfg.epsilon.sources:
        from audit.bounds.runner import epsilon_is_complete, run_epsilon

        if epsilon_is_complete(run, cfg.epsilon):
            res.steps.append(StepRecord("epsilon", "skipped (complete)"))
        else:
            _timed(res.steps, "epsilon", lambda: str(run_epsilon(run_dir=run, config=cfg.epsilon) and ""))
        log(f"[{label}] epsilon: {res.steps[-1].status}")

    if "transfer" in steps:
        if cfg.transfer.suite is None:
            res.steps.append(StepRecord("transfer", "not configured", detail="set transfer.suite to run it"))
        else:
            from audit.transfer.runner import evaluate_transfer
            from audit.transfer.suite import load_suite

            from foundation.config_io import resolve_config_path

            suite_path = resolve_config_path(cfg.transfer.suite)  # eval_configs/... from any directory

            def transfer_key() -> str:
                return inputs_digest(run, suite_sha256=sha256_file(suite_path), **_file_shas(run_dir, TRANSFER_FILE))

            if _ledger(run_dir).get("transfer", {}).get("key") == transfer_key():
                res.steps.append(StepRecord("transfer", "skipped (complete)"))
            else:
                suite = load_suite(suite_path)
                _timed(res.steps, "transfer", lambda: str(evaluate_transfer(run_dir=run, suite=suite) and ""))
                _mark(run_dir, "transfer", transfer_key())
        log(f"[{label}] transfer: {res.steps[-1].status}")

    if "report" in steps:
        from audit.reporting import write_report

        def report_key() -> str:
            return inputs_digest(run, pdf=cfg.report.pdf, manifest=run.manifest.model_dump(mode="json"),
                                 **_file_shas(run_dir, METRICS_FILE, ATTACK_FILE, EPSILON_FILE, TRANSFER_FILE,
                                              REPORT_HTML_FILE, REPORT_MD_FILE, REPORT_JSON_FILE))

        if _ledger(run_dir).get("report", {}).get("key") == report_key():
            res.steps.append(StepRecord("report", "skipped (complete)"))
        else:
            _timed(res.steps, "report", lambda: str(write_report(run_dir=run, pdf=cfg.report.pdf).html))
            _mark(run_dir, "report", report_key())
        log(f"[{label}] report: {res.steps[-1].status}")

    res.summary = summarize(run)
    return res


def summarize(run: Path | VerifiedRun) -> dict[str, Any]:
    """The headline numbers of one run directory (whatever steps have run)."""
    from audit.reporting.inputs import load_run

    files = load_run(run)
    out: dict[str, Any] = {"run": files.run_dir.name, "claimed_epsilon": files.manifest.privacy.claimed_epsilon}
    out["test_accuracy"] = files.test_accuracy
    if files.attack is not None and files.attack.attacks:
        from attacks.strongest import reference_level, strongest

        cands = {k: (e.metrics.auc, e.metrics.tpr_at_fpr, e.metrics.n_nonmembers)
                 for k, e in files.attack.attacks.items()}
        name = strongest(cands)  # the report's and the gate's definition (attacks/strongest.py)
        entry = files.attack.attacks[name]
        level = reference_level(cands)
        tpr = entry.metrics.tpr_at_fpr.get("0.001")
        out.update(strongest_attack=name, auc=entry.metrics.auc, reference_fpr=float(level) if level else None,
                   tpr_at_reference_fpr=entry.metrics.tpr_at_fpr.get(level) if level else None,
                   tpr_at_0_1pct_fpr=tpr if resolvable(0.001, entry.metrics.n_nonmembers)
                   else not_resolvable(entry.metrics.n_nonmembers))
    if files.epsilon is not None:
        v = files.epsilon.verdict
        out.update(epsilon_lb=v.best_epsilon_lb if v.best_method is not None else None, verdict=str(v.status),
                   inconclusive_above=v.inconclusive_above)
    return out


def preflight(cfg: RunConfig, steps: tuple[str, ...]) -> None:
    """Check the attack, epsilon and transfer settings of one variant before anything trains.

    Raises:
        UserError: the pool source reading an attack that is not run, or a transfer suite that does not load
            (``attack.n_reference`` and the attack names are checked when the config is built).
    """
    attacking = "attack" in steps and bool(cfg.attack.attacks)  # K was checked when the config was built
    if attacking and "epsilon" in steps and "pool" in cfg.epsilon.sources \
            and cfg.epsilon.attack not in cfg.attack.attacks:
        raise ConfigError(f"epsilon.attack is '{cfg.epsilon.attack}', but attack.attacks does not run it "
                          f"({', '.join(cfg.attack.attacks)}); add it there or choose one of those")
    if "transfer" in steps and cfg.transfer.suite is not None:
        from audit.transfer.suite import load_suite

        load_suite(Path(cfg.transfer.suite))


def run_pipeline(*, config: RunConfig, variants: list[str] | None = None, steps: tuple[str, ...] = STEPS,
                 retrain_shadows: bool = False, progress: bool = True, command: str | None = None,
                 log: Log = print, warn: Log | None = None) -> list[VariantResult]:
    """Run the configured steps for each variant (all variants by default) and return what happened.

    ``log`` gets one line per step; ``warn`` gets each training warning as it is found (None: they are only
    recorded in the run's manifest notes).

    Raises:
        UserError: a bad config, missing data, or a mismatched/corrupt file in a run directory.
    """
    names = variants or variant_names(config)
    chosen = [select_variant(config, name) for name in names]
    for cfg in chosen:  # every variant's settings are checked before any of them trains
        preflight(cfg, steps)
    results = []
    for cfg in chosen:
        results.append(_run_variant(cfg, steps=steps, retrain_shadows=retrain_shadows, progress=progress,
                                    command=command, log=log, warn=warn))
    summary_path = Path(config.output_dir) / f"{config.name}.summary.json"
    write_json(summary_path, {"config": config.name, "variants": [
        {"variant": r.variant, "run_dir": str(r.run_dir), **r.summary,
         "steps": [vars(s) for s in r.steps]} for r in results]})
    return results
