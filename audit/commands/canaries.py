"""`audit canaries make`: the auditor's canaries, the vendor's package and the commitment to publish.

Before writing, it states what the kit can detect (:mod:`audit.bounds.power`): for a claim, the smallest true ε at
which the one-run audit refutes it with probability >= ``--power``; ``--claim EPS`` without ``--count`` sizes the
kit for that claim, or refuses in one line when no kit up to ``--max-count`` can refute it.
"""

from __future__ import annotations

import click

_DEFAULT_CLAIMS = (1.0, 8.0)


def _reach(p) -> str:
    if p.epsilon_detectable is None:
        return f"the most the audit can show is ε_lb {p.ceiling:.3f}"
    return f"refuted when the true ε >= {p.epsilon_detectable:.3f}"


@click.group(name="canaries")
def command() -> None:
    """Auditor-chosen canaries for checking a vendor's privacy claim (make -> vendor trains -> audit epsilon)."""


@command.command(name="make")
@click.option("--count", type=click.IntRange(min=2), default=None,
              help="canaries m (each included with probability 1/2; default 2000, or sized for --claim)")
@click.option("--claim", type=click.FloatRange(min=0.0, min_open=True, max=1e6), default=None, metavar="EPS",
              help="the ε the vendor will claim: the power is stated for it and, without --count, the kit is the "
                   "fewest canaries whose audit refutes it with probability >= --power when the true ε is --factor x "
                   "EPS (perfect attack) or the guesses are --accuracy correct; refused when no kit can")
@click.option("--factor", type=click.FloatRange(min=1.0, min_open=True, max=1e6), default=2.0, show_default=True,
              help="sizing: the violation to detect, as true ε / claimed ε")
@click.option("--accuracy", type=click.FloatRange(min=0.5, max=1.0), default=None,
              help="expected accuracy of the attack's membership signal per canary (e.g. measured on a pilot "
                   "model); default: a perfect attack on the tight mechanism")
@click.option("--power", type=click.FloatRange(min=0.0, max=1.0, min_open=True, max_open=True), default=0.5,
              show_default=True, help="detection probability asked for (0.5: the median audit refutes)")
@click.option("--max-count", type=click.IntRange(min=2, max=1_000_000), default=20_000, show_default=True,
              help="sizing: the most canaries the kit may hold")
@click.option("--alpha", type=click.FloatRange(min=0.0, max=1.0, min_open=True, max_open=True), default=0.05,
              show_default=True, help="the audit's 1 - confidence (audit epsilon --alpha)")
@click.option("--delta", type=click.FloatRange(min=0.0, max=1.0, max_open=True), default=1e-5, show_default=True,
              help="the claim's δ")
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
def make(count: int | None, claim: float | None, factor: float, accuracy: float | None, power: float,
         max_count: int, alpha: float, delta: float, num_classes: int, image_size: int, kind: str,
         seed: int | None, out_dir: str, overwrite: bool) -> None:
    """Write the vendor package, the auditor's secret file and the commitment (publish it before training), and
    say which violations the kit can detect."""
    from audit.bounds.power import canaries_for_claim, kit_power
    from audit.canaries import make_canaries, write_canaries
    from foundation.errors import UserError

    if claim is not None and count is None:
        sized = canaries_for_claim(claim=claim, factor=factor, power=power, accuracy=accuracy, delta=delta,
                                   alpha=alpha, max_count=max_count)
        if sized is None:
            top = kit_power(m=max_count, claim=claim, delta=delta, alpha=alpha, power=power, accuracy=accuracy)
            want = (f"{100 * accuracy:.1f}% attack accuracy" if accuracy is not None
                    else f"a true ε of {factor:g}x the claim")
            raise UserError(f"no kit of up to {max_count} canaries can refute ε = {claim:g} with probability >= "
                            f"{power:g} given {want} at α = {alpha:g}, δ = {delta:g} (at {max_count} canaries: "
                            f"{_reach(top)}): an audit with canaries cannot verify this claim (the gate would say "
                            "UNVERIFIABLE); agree a smaller claim, or raise --max-count, lower --power or --factor "
                            "(the δ term 2·m·δ of the one-run bound caps what any number of canaries shows)")
        count = sized.m
        click.echo(f"--claim {claim:g}: {count} canaries")
    count = 2000 if count is None else count
    click.echo(f"power of {count} canaries (one-run audit at α = {alpha:g}, δ = {delta:g}; "
               f"{'stated' if accuracy is not None else 'perfect'} attack):")
    for c in (claim,) if claim is not None else _DEFAULT_CLAIMS:
        click.echo("  power: " + kit_power(m=count, claim=c, delta=delta, alpha=alpha, power=power,
                                           accuracy=accuracy).summary())
    secret = make_canaries(count=count, num_classes=num_classes, image_size=(image_size, image_size), kind=kind,
                           seed=seed)
    paths = write_canaries(out_dir, secret, overwrite=overwrite)
    click.echo(f"commitment: {secret.commitment}")
    click.echo(f"vendor package ({int(secret.included.sum())} of {count} canaries, shuffled, no inclusion bits): "
               f"{paths['package']}  -> the vendor trains with training.canaries.from_file={paths['package']}")
    click.echo(f"secret (keep it until the model is delivered): {paths['secret']}")
    click.echo(f"commitment (publish it now): {paths['commitment']}")
