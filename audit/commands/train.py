"""`audit train CONFIG`: train one model (DP or not) and write its run directory."""

from __future__ import annotations

import shlex
import sys

import click


@click.command(name="train")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override a config value, e.g. --set privacy.target_epsilon=4 (repeatable)")
@click.option("--variant", default=None, help="train this variant of a config that defines several")
@click.option("--resume", is_flag=True, help="continue an interrupted run from its last saved state")
@click.option("--overwrite", is_flag=True, help="delete an existing run directory with the same name first")
@click.option("--download", is_flag=True, help="let torchvision download the dataset (needs internet)")
@click.option("--no-progress", is_flag=True, help="no progress bar")
@click.option("--nproc", type=click.IntRange(min=1), default=None,
              help="train in N processes on this machine: runs torchrun --nproc-per-node N -m audit train ... "
                   "(each process takes its share of every batch; gloo on CPU, NCCL on GPUs); it listens on "
                   "127.0.0.1 only unless --rdzv-endpoint is given")
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True,
              help="machines training together, each running this command with the same --rdzv-endpoint")
@click.option("--rdzv-endpoint", default=None, metavar="HOST:PORT",
              help="multi-node: the rendezvous store on the first machine, reachable from every other (opens the "
                   "launch to the network; without it everything stays on 127.0.0.1)")
def command(config: str, overrides: tuple[str, ...], variant: str | None, resume: bool, overwrite: bool,
            download: bool, no_progress: bool, nproc: int | None, nnodes: int, rdzv_endpoint: str | None) -> None:
    """Train the model described by CONFIG and write results/<name>/ (weights, manifest, membership, metrics).

    Several processes: --nproc N (this machine, on loopback), or --nproc N --nnodes M --rdzv-endpoint HOST:PORT
    on each of M machines; torchrun --nproc-per-node N -m audit train CONFIG works too.
    """
    from audit.api import train
    from audit.config import load_run_config, select_variant
    from foundation.errors import UserError
    from training.distributed import Rendezvous, launch, recorded_command, world_from_env

    world = world_from_env()
    try:
        rendezvous = Rendezvous(nnodes=nnodes, endpoint=rdzv_endpoint)
    except ValueError as exc:
        raise UserError(f"{exc}; e.g. --nnodes 2 --rdzv-endpoint node0:29400") from None
    if ((nproc or 1) > 1 or not rendezvous.local) and not world.distributed:
        extra = list(overrides) + (["data.download=true"] if download else [])
        select_variant(load_run_config(config, extra), variant).train_config()  # config errors before any launch
        args = ["train", config, *(a for o in overrides for a in ("--set", o)),
                *(["--variant", variant] if variant is not None else []), *(["--resume"] if resume else []),
                *(["--overwrite"] if overwrite else []), *(["--download"] if download else []),
                *(["--no-progress"] if no_progress else [])]
        sys.exit(launch(args, nproc=nproc or 1, rendezvous=rendezvous, command=shlex.join(["audit", *sys.argv[1:]])))
    result = train(config, overrides=overrides, variant=variant, resume=resume, overwrite=overwrite,
                   download=download, progress=False if no_progress else None,
                   command=recorded_command(sys.argv[1:]),
                   warn=lambda message: click.echo(f"warning: {message}", err=True))
    if not world.is_main:
        return
    m, p = result.metrics, result.manifest.privacy
    status = "already complete" if result.already_complete else (
        f"resumed at step {result.resumed_from}" if result.resumed_from else "done")
    eps = f"epsilon={p.epsilon:.3f} (delta={p.delta:.1e}, {p.accountant}; PLD {p.epsilon_cross_check['epsilon']:.3f})" \
        if p.dp else "no DP (epsilon = inf)"
    acc = m.get("test_accuracy")
    click.echo(f"{status}: {result.run_dir}  {eps}  test accuracy "
               f"{'n/a' if acc is None else f'{acc:.4f}'}")

