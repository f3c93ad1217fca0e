"""``results/reference/seed_findings.md``: every seed-paper claim, our measurement, the test, the verdict, the command.

Reads the continual-pretraining run directories (:mod:`experiments.papers`), the arms' JSON
(:mod:`experiments.arms`) and, for Ke et al.'s budget-split claims, the statistics of the committed
``finetune_strategies[.scale].md`` table of the largest scale that has one. Every test is from
:mod:`experiments.stats`, two-sided: a claim is "reproduced" only when its (corrected) test rejects at 0.05 in the
paper's direction, "not reproduced" when it rejects in the other direction, "inconclusive" otherwise; a claim of
sameness is tested for equivalence (TOST against a stated margin). The "Untested" section lists what no row tests.

    python -m experiments findings [--scales gpu_full gpu_full_vit_long cpu_vit_long cpu_vit_ke ... cpu]
"""

from __future__ import annotations

import argparse
import json
import os

from experiments.findings.arms import (bu_arm_rows, ganesh_contrast_rows, ganesh_control_rows, ganesh_rows, ke_rows,
                                       plateau_room_rows, trace_arm_rows)
from experiments.findings.continual import continual_rows
from experiments.findings.finetune import finetune_table_rows
from experiments.findings.law import vit_rows
from experiments.findings.membership import membership_rows
from experiments.findings.rows import arm_result
from experiments.findings.text import sections
from experiments.findings.untested import untested_section
from experiments.papers.runs import OUT, ROOT


SECTIONS = (continual_rows, bu_arm_rows, plateau_room_rows, membership_rows, trace_arm_rows, finetune_table_rows,
            ke_rows, ganesh_rows, ganesh_control_rows, ganesh_contrast_rows, vit_rows)
SCALES = ("gpu_full", "gpu_full_vit_long", "cpu_vit_long", "cpu_vit_ke", "gpu_full_vit", "gpu", "gpu_vit", "cpu_hour",
          "cpu_hour_vit", "cpu")


#: the per-seed values of the configs' runs (the rows' tests read them from run directories that travel as
#: tarballs), written beside the table as small JSON whenever the runs are on this machine
PER_SEED_JSON = "seed_findings.per_seed.json"


def config_runs_per_seed() -> dict[str, dict[str, dict[str, float]]]:
    """{"<config>/<scale>": {variant: {seed: test accuracy}}} of every configs' run on this machine (the continual
    sweep and rules, the budget-split strategies and their non-DP reference); empty where none is here."""
    from experiments.papers.runs import SCALES as RUN_SCALES, groups

    out: dict[str, dict[str, dict[str, float]]] = {}
    for config in ("continual", "finetune"):
        for sc in RUN_SCALES:
            g = groups(config, sc)
            if g:
                out[f"{config}/{sc}"] = {k: {str(seed): x["test_accuracy"] for seed, _, x in runs}
                                         for k, runs in sorted(g.items())}
    return out


def merged_per_seed(here: dict[str, dict[str, dict[str, float]]], kept: dict[str, dict[str, dict[str, float]]]
                    ) -> dict[str, dict[str, dict[str, float]]]:
    """The committed per-seed values ``kept`` updated with the runs on this machine ``here``: a (config, scale,
    variant) whose runs are here is re-read from them, one whose runs are not keeps its committed values.

    >>> merged_per_seed({"f/a": {"x": {"0": 0.5}}}, {"f/a": {"y": {"0": 0.1}}, "c/b": {"z": {"1": 0.2}}})
    {'c/b': {'z': {'1': 0.2}}, 'f/a': {'x': {'0': 0.5}, 'y': {'0': 0.1}}}
    """
    out = {k: dict(v) for k, v in kept.items()}
    for key, variants in here.items():
        out.setdefault(key, {}).update(variants)
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def archive_section() -> list[str]:
    """Where each row's per-seed values are kept (an archive is named only where its file is committed)."""
    kept = json.loads((OUT / PER_SEED_JSON).read_text()) if (OUT / PER_SEED_JSON).is_file() else {}
    ref = [k for k in ("lp-nondp", "fft-nondp") if k in kept.get("finetune/gpu_full", {})]
    mia = sorted(p.parent.name for p in (OUT / "seed_arms").glob("*_mia/membership.json"))
    return [
        "## Where the per-seed values are", "",
        "* The arms' rows: `results/reference/seed_arms/<scale>/<arm>.json` (`per_seed`: one value per seed, in the "
        "order of its `seeds`) and, for runs made of parts, `parts/` beside it; the Ganesh et al. control's parts at "
        "`cpu_hour` are `seed_arms/cpu_hour/parts/ganesh.s<seed>.same_random.json`.",
        f"* The configs' rows: `results/reference/{PER_SEED_JSON}` (test accuracy per variant and seed, written from "
        "the runs by this command), the runs themselves in the `seed_gpu/*.tgz` archives.",
        *([f"* The membership (LiRA / RMIA) row: `results/reference/seed_arms/{', '.join(mia)}/membership.json` "
           "(`per_seed`: one value per target model, in model order, for every attack and metric; `summary`: the "
           "pooled metrics and the strongest attack per training), its parts in `parts/` beside it."] if mia else []),
        "* Ke et al.'s budget split at `gpu_full`: its 50 DP runs' per-seed values are not archived anywhere (see "
        "Untested); its rows test the committed `finetune_strategies.gpu_full.md`'s mean ± SD."
        + (f" Its non-DP reference runs ({', '.join(f'`{k}`' for k in ref)}) are in `{PER_SEED_JSON}` under "
           "`finetune/gpu_full`, re-made on this CPU by `python -m experiments papers run finetune --scale gpu_full "
           "--workers 1 --variants '*-nondp-*'` after `python -m experiments gpu prepare --jpeg`, `gpu decode` and "
           "`gpu unpack results/reference/seed_gpu/ft_source_gpu_full.tgz` (the same data and source as the DP runs), "
           "then this command." if ref else " No non-DP reference runs at this scale are archived."), ""]


def main(argv: list[str] | None = None, prog: str = "python -m experiments findings") -> int:
    from foundation.io import write_text

    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", nargs="+", default=list(SCALES),
                        help="for each group of claims, the first of these scales that has results is used")
    args = parser.parse_args(argv)
    # the decelerator read-off calibrates σ for switch steps no run used: keep them in the runs' σ cache (as
    # experiments gpu does) instead of recalibrating on every re-make
    from training.accounting.sigma_cache import SIGMA_CACHE_ENV

    os.environ.setdefault(SIGMA_CACHE_ENV, str(ROOT / "results/sigma-cache"))
    scale_note, in_words, closing = sections()
    rows: list[str] = []
    settings: dict[str, dict] = {}
    for fn in SECTIONS:
        for sc in args.scales:
            got = fn(sc)
            if got:
                rows += got
                arm = next((a for a in (arm_result(sc, n) for n in ("continual", "trace", "ke", "ganesh", "vit"))
                            if a), None)
                if arm:
                    settings[sc] = {**arm.get("scale_settings", {}),
                                    **({"mixed_settings": arm["mixed_settings"]} if "mixed_settings" in arm else {})}
                if fn is not continual_rows:  # the configs' runs: every scale that has them (the GPU sweep and the
                    break                     # CPU runs measure different claims); the arms: the largest scale
    text = "\n".join([
        "# The seed papers' findings, claim by claim", "",
        "Re-make: each row's command (the `--scale` it names), then `python -m experiments findings`; the GPU "
        "rows' runs are kept in `results/reference/seed_gpu/runs.tgz` (`gpu`) and `gpu_full_runs.tgz` beside it, "
        "the `cpu_hour` configs' runs in "
        "`cpu_hour_runs.tgz` beside it (`python -m experiments gpu unpack FILE` puts them back), the arms' in "
        "`results/reference/seed_arms/<scale>/`.", "",
        *scale_note, "",
        "| paper | claim | scale | our measurement (mean ± SD over seeds) | test (correction) | verdict | command |",
        "|---|---|---|---|---|---|---|", *rows, "", *in_words, *closing, "", *untested_section(),
        *archive_section(), "## Scale settings", "",
        *[f"* `{sc}`: `{json.dumps(v)}`" for sc, v in settings.items()], ""])
    write_text(OUT / "seed_findings.md", text)
    per_seed = config_runs_per_seed()
    if per_seed:  # runs are here: their per-seed values join the committed ones (runs not here keep theirs)
        from foundation.io import write_json

        kept = json.loads((OUT / PER_SEED_JSON).read_text()) if (OUT / PER_SEED_JSON).is_file() else {}
        write_json(OUT / PER_SEED_JSON, merged_per_seed(per_seed, kept))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
