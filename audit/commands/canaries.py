"""`audit canaries make`: the auditor's canaries, the vendor's package and the commitment to publish."""

from __future__ import annotations

import click


@click.group(name="canaries")
def command() -> None:
    """Auditor-chosen canaries for checking a vendor's privacy claim (make -> vendor trains -> audit epsilon)."""


@command.command(name="make")
@click.option("--count", type=click.IntRange(min=20), default=None,
              help="canaries m (each included with probability 1/2; default 2000, or sized for --claim)")
@click.option("--claim", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="the ε the vendor will claim: the kit is sized so that the audit can refute it (and says if no "
                   "size can)")
@click.option("--memorisation", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=0.5,
              show_default=True, help="fraction of member canaries the model is expected to memorise")
@click.option("--alpha", type=click.FloatRange(min=0.0, max=1.0, min_open=True, max_open=True), default=0.05,
              show_default=True, help="the audit's 1 - confidence")
@click.option("--delta", type=click.FloatRange(min=0.0, max=1.0, min_open=True, max_open=True), default=1e-5,
              show_default=True, help="the claim's δ")
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
def make(count: int | None, claim: float | None, memorisation: float, alpha: float, delta: float, num_classes: int,
         image_size: int, kind: str, seed: int | None, out_dir: str, overwrite: bool) -> None:
    """Write the vendor package, the auditor's secret file and the commitment (publish it before training), and
    say which claims the kit can refute."""
    from audit.canaries import make_canaries, write_canaries
    from audit.canaries.power import KIT_SIZES, kit_power, size_kit
    from foundation.errors import UserError

    power = None
    if claim is not None and count is None:
        power = size_kit(claim=claim, alpha=alpha, delta=delta, memorisation=memorisation)
        if power is None:
            biggest = kit_power(m=KIT_SIZES[-1], alpha=alpha, delta=delta, memorisation=memorisation)
            raise UserError(f"no kit of up to {KIT_SIZES[-1]} canaries can refute ε = {claim:g} at "
                            f"{memorisation:.0%} memorisation (the largest reaches ε = {biggest.detectable:.3g}): "
                            f"an audit with canaries cannot verify this claim (the gate would say UNVERIFIABLE); "
                            f"agree a smaller claim")
        count = power.m
    count = 2000 if count is None else count
    power = power or kit_power(m=count, alpha=alpha, delta=delta, memorisation=memorisation)
    if claim is not None and not power.detectable > claim:
        click.echo(f"warning: {count} canaries cannot refute ε = {claim:g} at {memorisation:.0%} memorisation "
                   f"(they reach ε = {power.detectable:.3g}); omit --count to size the kit", err=True)
    secret = make_canaries(count=count, num_classes=num_classes, image_size=(image_size, image_size), kind=kind,
                           seed=seed)
    paths = write_canaries(out_dir, secret, overwrite=overwrite)
    click.echo(f"commitment: {secret.commitment}")
    click.echo(f"vendor package ({int(secret.included.sum())} of {count} canaries, shuffled, no inclusion bits): "
               f"{paths['package']}  -> the vendor trains with training.canaries.from_file={paths['package']}")
    click.echo(f"secret (keep it until the model is delivered): {paths['secret']}")
    click.echo(f"commitment (publish it now): {paths['commitment']}")
    click.echo(f"power: {power.sentence()}")
