"""`audit canaries make`: the auditor's canaries, the vendor's package and the commitment to publish."""

from __future__ import annotations

import click


@click.group(name="canaries")
def command() -> None:
    """Auditor-chosen canaries for checking a vendor's privacy claim (make -> vendor trains -> audit epsilon)."""


@command.command(name="make")
@click.option("--count", type=click.IntRange(min=2), default=2000, show_default=True,
              help="canaries m (each included with probability 1/2; 1,000-5,000 give a useful ceiling)")
@click.option("--num-classes", type=click.IntRange(min=2), required=True, help="classes of the vendor's task")
@click.option("--image-size", type=click.IntRange(min=1, max=1024), required=True,
              help="side of the vendor's (square) training images")
@click.option("--kind", type=click.Choice(["ood"]), default="ood", show_default=True,
              help="ood: uniform-noise colour images with random labels (memorised one by one)")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="secret seed (default: 63 random bits from the OS); a guessable seed lets the vendor rebuild the "
                   "inclusion bits, so pass one only for reproducible experiments")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="directory to write into")
@click.option("--overwrite", is_flag=True, help="replace canary files already in --out")
def make(count: int, num_classes: int, image_size: int, kind: str, seed: int | None, out_dir: str,
         overwrite: bool) -> None:
    """Write the vendor package, the auditor's secret file and the commitment (publish it before training)."""
    from audit.canaries import make_canaries, write_canaries

    secret = make_canaries(count=count, num_classes=num_classes, image_size=(image_size, image_size), kind=kind,
                           seed=seed)
    paths = write_canaries(out_dir, secret, overwrite=overwrite)
    click.echo(f"commitment: {secret.commitment}")
    click.echo(f"vendor package ({int(secret.included.sum())} of {count} canaries, shuffled, no inclusion bits): "
               f"{paths['package']}  -> the vendor trains with training.canaries.from_file={paths['package']}")
    click.echo(f"secret (keep it until the model is delivered): {paths['secret']}")
    click.echo(f"commitment (publish it now): {paths['commitment']}")
