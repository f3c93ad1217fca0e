"""`audit gate BASELINE CANDIDATE --policy POLICY`: a CI gate over two run directories.

Exit codes: 0 every rule passed; 1 a rule failed; 2 bad input (missing, unsigned, edited or stale files, unknown
policy keys, runs that cannot be compared); 3 UNVERIFIABLE: no rule failed, but the audit could not have detected a
violation of the candidate's claim (not a pass unless the policy says ``accept_unverifiable: true``). The library function is :func:`audit.api.gate` (``audit.gate(...)``), over :func:`audit.gating.evaluate_gate`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from audit.api import gate
from audit.gating import GateResult
from foundation.files import GATE_FILE


def print_gate(result: GateResult, *, file=None) -> None:
    """Print a gate result as a table (rule, baseline, candidate, threshold, PASS/FAIL) with rich."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    out = file if file is not None else sys.stdout
    console = Console(file=out, width=None if getattr(out, "isatty", lambda: False)() else 140,
                      highlight=False, soft_wrap=False)
    table = Table(title=f"dp-audit gate ({result.policy})", show_lines=False)
    for col, justify in (("rule", "left"), ("baseline", "right"), ("candidate", "right"),
                         ("threshold", "right"), ("result", "center")):
        table.add_column(col, justify=justify)
    for r in result.rules:
        verdict = {"PASS": "[bold green]PASS[/]", "FAIL": "[bold red]FAIL[/]",
                   "UNVERIFIABLE": "[bold yellow]UNVERIFIABLE[/]", "NOT_RUN": "[dim]NOT RUN[/]"}[r.outcome]
        table.add_row(r.label, r.baseline, r.candidate, r.threshold, verdict)
    console.print(table)
    for r in result.rules:
        if not r.passed:
            console.print(f"[red]{r.outcome}[/] {r.rule}: {escape(r.detail)}")
        elif not r.ran:
            console.print(f"NOT RUN {r.rule}: {escape(r.detail)}")
    if result.strongest_attack is not None:
        s = result.strongest_attack
        console.print(escape(f"strongest attack ({s['definition']}): baseline {s['baseline'] or 'none'}, "
                             f"candidate {s['candidate'] or 'none'}"))
    for note in result.notes:
        console.print(f"note: {note}")
    word = {"PASS": "[bold green]PASSED[/]", "FAIL": "[bold red]FAILED[/]",
            "UNVERIFIABLE": "[bold yellow]UNVERIFIABLE[/] (not passed: the audit could not have detected a violation)"}
    ran = [r for r in result.rules if r.ran]
    not_run = len(result.rules) - len(ran)
    console.print(f"gate {word[result.status]}: {sum(r.passed for r in ran)}/{len(ran)} rules pass"
                  + (f", {not_run} not run" if not_run else "")
                  + f" (baseline {result.baseline}, candidate {result.candidate})")


@click.command(name="gate")
@click.argument("baseline", type=click.Path(file_okay=False, path_type=Path))
@click.argument("candidate", type=click.Path(file_okay=False, path_type=Path))
@click.option("--policy", "policy", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="gate policy YAML (e.g. eval_configs/gates/default.yaml)")
@click.option("--out", "out", default=Path(GATE_FILE), show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="where to write the JSON result")
def command(baseline: Path, candidate: Path, policy: Path, out: Path) -> None:
    """Compare CANDIDATE with BASELINE under a policy; exit 0 pass, 1 fail, 2 bad input, 3 unverifiable."""
    result = gate(baseline, candidate, policy=policy, out=out)
    print_gate(result)
    click.echo(f"wrote {out}")
    if not result.passed:
        sys.exit(result.exit_code)
