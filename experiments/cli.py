"""``python -m experiments`` / ``dp-audit-experiments``: one command line for the seed-paper reproductions.

Each subcommand is one concept's own command line, its options unchanged:

* ``papers run|tables``: the experiment configs' runs and their tables (:mod:`experiments.papers.cli`);
* ``arms run|merge|pretrained|adopt``: the extra arms (:mod:`experiments.arms.runner`);
* ``gpu prepare|decode|run|pack|unpack|profile``: the runs on a lent GPU machine (:mod:`experiments.gpu.cli`);
* ``findings``: ``results/reference/seed_findings.md`` from the result files (:mod:`experiments.findings.cli`);
* ``vit-probe``: the ViT arm's pre-training recipe on this CPU (:mod:`experiments.arms.probe`).

>>> main(["--help"])  # doctest: +ELLIPSIS
usage: python -m experiments {papers,arms,gpu,findings,vit-probe} ...
...
0
"""

from __future__ import annotations

import importlib
import sys

#: subcommand -> (module with ``main(argv) -> int``, what it does)
COMMANDS = {
    "papers": ("experiments.papers.cli", "train the experiment configs' variants; write their tables"),
    "arms": ("experiments.arms.runner", "run, merge or adopt the extra arms' results"),
    "gpu": ("experiments.gpu.cli", "prepare data for, run on, and pack/unpack results of a lent GPU machine"),
    "findings": ("experiments.findings.cli", "write results/reference/seed_findings.md from the result files"),
    "vit-probe": ("experiments.arms.probe", "time the ViT arm's public pre-training recipes on this CPU"),
}
USAGE = "usage: python -m experiments {" + ",".join(COMMANDS) + "} ..."


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand with the rest of ``argv``; exit status 2 (and the usage) for an unknown one."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\nThe seed-paper reproductions (not part of the dp-audit product).\n")
        for name, (_, what) in COMMANDS.items():
            print(f"  {name:<9} {what}")
        print("\n`python -m experiments COMMAND --help` lists a command's options.")
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"{USAGE}\nerror: unknown command {argv[0]!r}: choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(argv[1:], prog=f"python -m experiments {argv[0]}")
