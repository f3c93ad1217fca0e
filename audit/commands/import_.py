"""`audit import`: make an externally trained checkpoint auditable (see :mod:`audit.importer`)."""

from __future__ import annotations

import json
import shlex
import sys

import click

from foundation.errors import ConfigError


@click.command(name="import")
@click.option("--weights", required=True, type=click.Path(dir_okay=False),
              help="state dict: .safetensors or .pt/.pth/.th/.bin (read without unpickling)")
@click.option("--arch", required=True, help="architecture: resnet20_cifar, resnet32_cifar, resnet44_cifar, "
              "resnet56_cifar, resnet110_cifar (He et al. CIFAR ResNets), resnet_cifar (give its depth), small_cnn, "
              "mlp, a timm name, ...")
@click.option("--kwargs", "kwargs_json", default=None, help="extra architecture kwargs as JSON, e.g. "
              "'{\"depth\": 110}' for resnet_cifar (any 6n + 2; the resnet<depth>_cifar names accept their own depth)")
@click.option("--num-classes", type=click.IntRange(min=2), default=None, help="logits (default: the data's classes)")
@click.option("--normalize-mean", nargs=3, type=float, default=None,
              help="input mean the checkpoint expects (3 floats)")
@click.option("--normalize-std", nargs=3, type=float, default=None, help="input std the checkpoint expects (3 floats)")
@click.option("--cifar-stem/--no-cifar-stem", default=True, show_default=True, help="small-image stem")
@click.option("--fix-batchnorm/--no-fix-batchnorm", default=False, show_default=True,
              help="replace BatchNorm with GroupNorm (keep it off for checkpoints trained with BatchNorm)")
@click.option("--members", required=True, metavar="DATASET:SPLIT", help="data the model was trained on")
@click.option("--nonmembers", required=True, metavar="DATASET:SPLIT", help="data the model never saw")
@click.option("--root", default=None, help="data root for both sources (npz folder, torchvision root, ...)")
@click.option("--members-root", default=None, help="data root of the members (overrides --root)")
@click.option("--nonmembers-root", default=None, help="data root of the non-members (overrides --root)")
@click.option("--image-size", type=click.IntRange(min=1), default=None, help="resize images to this size")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="at most this many examples per source")
@click.option("--population", type=click.IntRange(min=0), default=0, show_default=True,
              help="non-members held out of the pool as population samples for Attack-P / RMIA")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the population hold-out")
@click.option("--claimed-epsilon", type=float, default=None, help="the provider's DP claim (with --delta)")
@click.option("--delta", type=float, default=None, help="delta of the claim")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="run directory to write")
@click.option("--overwrite", is_flag=True, help="replace an existing run directory")
def command(weights: str, arch: str, kwargs_json: str | None, num_classes: int | None,
            normalize_mean: tuple[float, ...] | None, normalize_std: tuple[float, ...] | None, cifar_stem: bool,
            fix_batchnorm: bool, members: str, nonmembers: str, root: str | None, members_root: str | None,
            nonmembers_root: str | None, image_size: int | None, limit: int | None, population: int, seed: int,
            claimed_epsilon: float | None, delta: float | None, out: str, overwrite: bool) -> None:
    """Convert an externally trained checkpoint into a run directory OUT that `audit attack` can audit."""
    from audit.importer import import_checkpoint, parse_source

    try:
        kwargs = json.loads(kwargs_json) if kwargs_json else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--kwargs must be a JSON object: {exc}") from None
    if not isinstance(kwargs, dict):
        raise ConfigError(f"--kwargs must be a JSON object, got {kwargs_json!r}")
    result = import_checkpoint(
        weights=weights, arch=arch, kwargs=kwargs, num_classes=num_classes,
        normalize_mean=normalize_mean or None, normalize_std=normalize_std or None, cifar_stem=cifar_stem,
        fix_batchnorm=fix_batchnorm,
        members=parse_source(members, root=members_root or root, image_size=image_size, limit=limit),
        nonmembers=parse_source(nonmembers, root=nonmembers_root or root, image_size=image_size, limit=limit),
        population=population, seed=seed, claimed_epsilon=claimed_epsilon, delta=delta, out=out,
        overwrite=overwrite, command=shlex.join(["audit", *sys.argv[1:]]))
    m, d = result.metrics, result.manifest.data
    click.echo(f"imported {weights} -> {result.run_dir}: pool {d.pool_size} ({d.membership.n_members} members), "
               f"{result.n_population} population samples held out")
    click.echo(f"accuracy on members {m['train_accuracy']:.4f}, on non-members {m['test_accuracy']:.4f}")
    chance = 1.0 / result.manifest.model.num_classes
    if m["train_accuracy"] is not None and m["train_accuracy"] < 1.5 * chance:
        click.echo("warning: accuracy near chance: check --normalize-mean/--normalize-std, --arch and the data",
                   err=True)
    click.echo(f"next: audit attack {result.run_dir}")
