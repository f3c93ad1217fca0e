"""Reproduce the seed papers' claims and write the tables in ``results/reference/``.

* Bu et al. 2024 (DP continual pre-training; the decelerator σ²·tr(H)/(B·c²)):
  ``eval_configs/experiments/continual_pretrain.yaml`` → ``continual_pretrain.md`` and ``decelerator.md``
  (:mod:`experiments.papers.continual`).
* Ke, Hou, Fanti, Oh 2024 (DP-LP vs DP-FFT vs DP-LP-FFT with the ε budget split):
  ``eval_configs/experiments/finetune_source.yaml`` then ``finetune_strategies.yaml`` → ``finetune_strategies.md``
  (:mod:`experiments.papers.finetune`).

The arms these configs cannot express (σ = 0, head inits, the Ganesh et al. sweep and loss barriers, ...) are in
:mod:`experiments.arms`; ``results/reference/seed_findings.md`` gathers every claim.

Usage (from the repository root; needs ``../shared/data``)::

    python -m experiments papers run continual finetune_source finetune --workers 2 [--scale full]
    python -m experiments papers tables [--scale full]

``run`` is ``audit run CONFIG --steps train`` (the same library call, :func:`audit.pipeline.run_pipeline`) with the
variants spread over ``--workers`` processes of one thread each. Runs that are already complete are skipped,
interrupted ones resume. ``--scale`` picks the seeds, steps and sizes (:data:`experiments.papers.runs.SCALES`: ``cpu`` = the
configs as committed, ``full`` = issue 16's scale in its own output directory). ``tables`` reads the run
directories and writes the markdown tables: every number in them comes from those files.
"""

from __future__ import annotations

import argparse
import os

from experiments.papers.runs import CONFIGS, OUT, ROOT, SCALES, run


def _rows(text: str) -> int:
    """Table rows of a Markdown text (lines that start with '|', headers and rules included)."""
    return sum(line.startswith("|") for line in text.splitlines())


def tables(scale: str, *, force: bool = False) -> None:
    """Re-make the three tables of ``scale`` from the runs found here. A table that would lose rows (its runs are
    not on this machine, e.g. a lease's) is kept as it is unless ``force``."""
    from experiments.papers.continual import table_continual, table_decelerator
    from experiments.papers.finetune import table_finetune
    from foundation.io import write_text

    os.chdir(ROOT)
    suffix = "" if scale == "cpu" else f".{scale}"
    for name, fn in (("continual_pretrain", table_continual), ("decelerator", table_decelerator),
                     ("finetune_strategies", table_finetune)):
        text = fn(scale)
        if text is None:
            print(f"{name}: no finished runs yet, skipped")
            continue
        out = OUT / f"{name}{suffix}.md"
        if not force and out.is_file() and _rows(text) < _rows(out.read_text()):
            print(f"{name}: kept {out}: the runs here make {_rows(text)} table lines where it has "
                  f"{_rows(out.read_text())} (its other runs are not on this machine); --force overwrites it")
            continue
        write_text(out, text)
        print(f"wrote {out}")


def main(argv: list[str] | None = None, prog: str = "python -m experiments papers") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help="train the experiment configs' variants (audit run --steps train)")
    p_run.add_argument("names", nargs="+", choices=sorted(CONFIGS))
    p_run.add_argument("--workers", type=int, default=2)
    p_run.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    p_run.add_argument("--variants", nargs="+", default=None, metavar="PATTERN",
                       help="only the variants matching these shell patterns, e.g. '*-nondp-*'")
    p_tab = sub.add_parser("tables", help="write results/reference/{continual_pretrain,decelerator,"
                                          "finetune_strategies}[.SCALE].md")
    p_tab.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    p_tab.add_argument("--force", action="store_true", help="overwrite a table even when the new one has fewer rows")
    args = parser.parse_args(argv)
    if args.cmd == "run":
        run(args.names, workers=args.workers, scale=args.scale, only=args.variants)
    else:
        tables(args.scale, force=args.force)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
