"""`audit attack RUN`: membership-inference attacks on a run directory (see :mod:`attacks.runner`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from audit.config import AttackConfig, load_run_config, select_variant
from training.config import apply_overrides, parse_override, validate_config
from training.errors import ConfigError

REFERENCE_FREE = ("loss", "attack_p")


def resolve_attack_config(*, run_dir: str | Path, config_path: str | None = None, variant: str | None = None,
                          overrides: tuple[str, ...] = ()) -> AttackConfig:
    """The attack settings: the ``attack:`` section of ``config_path`` (its variant for this run), or the
    defaults, with ``--set`` overrides applied.

    Without a config file only ``attack.*`` keys may be overridden. With one, the variant is ``variant`` or
    the one whose run name (``<name>-<variant>``) is the run directory's name.

    Raises:
        ConfigError: unknown keys or values, a non-``attack.*`` override without a config file, or an
            ambiguous variant.
    """
    if config_path is None:
        bad = [o for o in overrides if parse_override(o)[0][0] != "attack"]
        if bad:
            raise ConfigError(f"--set {bad[0]}: audit attack only takes attack.* settings (training settings are "
                              f"fixed by the run); pass --config to read a whole experiment file")
        data = apply_overrides({"attack": {}}, list(overrides))
        return validate_config(data["attack"] or {}, AttackConfig, source="attack settings")
    cfg = load_run_config(config_path, list(overrides))
    if cfg.variants and variant is None:
        names = [v for v in cfg.variants if f"{cfg.name}-{v}" == Path(run_dir).name]
        variant = names[0] if names else None
    return select_variant(cfg, variant).attack


def _explicit_attacks(overrides: tuple[str, ...], config_path: str | None) -> bool:
    return config_path is not None or any(parse_override(o)[0] == ["attack", "attacks"] for o in overrides)


def _fmt_ci(ci: Any) -> str:
    return "" if not ci else f" [{ci[0]:.2f}, {ci[1]:.2f}]"


def _print_table(result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    report = result.report
    setup = report["setup"]
    table = Table(title=f"{report['run']}: {setup['n_members']} members / {setup['pool_size']} pool, "
                        f"{setup['n_reference']} reference models, evaluation {setup['evaluation']}")
    table.add_column("attack", min_width=22, no_wrap=True)
    table.add_column("AUC [95% CI]", justify="right", no_wrap=True)
    for level in ("TPR@1%", "@0.1%", "@0.01%"):
        table.add_column(level, justify="right", no_wrap=True)
    for name, entry in report["attacks"].items():
        m = entry["metrics"]
        tpr = m["tpr_at_fpr"]
        table.add_row(name, f"{m['auc']:.3f}{_fmt_ci(m.get('auc_ci'))}",
                      *(f"{100 * tpr[k]:.2f}%" for k in ("0.01", "0.001", "0.0001")))
    console = Console()
    console.print(table)
    console.print(f"wrote {result.run_dir / 'attack.json'} and {result.run_dir / 'scores.npz'}")


@click.command(name="attack")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="experiment YAML whose attack: section to use (default: built-in attack settings)")
@click.option("--variant", default=None, help="variant of --config (default: the one named like RUN)")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override an attack setting, e.g. --set attack.n_reference=16 (repeatable)")
@click.option("--retrain-shadows", is_flag=True, help="delete the reference models under RUN/shadows and retrain")
@click.option("--executor", type=click.Choice(["auto", "batched", "sequential", "process"]), default=None,
              help="how reference models train (default: attack.executor)")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="processes for --executor process")
@click.option("--no-progress", is_flag=True, help="no progress messages")
@click.option("--trust-code", is_flag=True,
              help="allow the run directory to name code to import (model.arch 'package.module:factory'); "
                   "only if you trust who made it (recorded in the results)")
def command(run: str, config_path: str | None, variant: str | None, overrides: tuple[str, ...],
            retrain_shadows: bool, executor: str | None, workers: int | None, no_progress: bool,
            trust_code: bool) -> None:
    """Attack the run in RUN (LOSS, Attack-P, LiRA, RMIA, ...) and write RUN/attack.json and RUN/scores.npz."""
    from attacks.runner import run_attack
    from attacks.target import has_recipe

    extra = [f"attack.executor={executor}"] * (executor is not None) + [f"attack.workers={workers}"] * (
        workers is not None)
    config = resolve_attack_config(run_dir=run, config_path=config_path, variant=variant,
                                   overrides=tuple(overrides) + tuple(extra))
    if not has_recipe(run) and not _explicit_attacks(tuple(overrides), config_path):
        config = config.model_copy(update={"attacks": REFERENCE_FREE, "evaluation": "target"})
        click.echo(f"note: {run} has no training recipe (config.yaml): running only {', '.join(REFERENCE_FREE)}",
                   err=True)
    result = run_attack(run_dir=run, config=config, retrain_shadows=retrain_shadows, progress=not no_progress,
                        trust_code=trust_code)
    _print_table(result)
