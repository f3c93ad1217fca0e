"""The "Untested" section of ``results/reference/seed_findings.md``: the seed papers' claims no row tests, each with
why, and what a later session would run (the command where one exists, else what is missing).

No measured figure is quoted here: each item names the file or row that holds the numbers it refers to, so the
section stays true when results are re-made.
"""

from __future__ import annotations

#: (claim, why it is untested, what would test it)
UNTESTED: tuple[tuple[str, str, str], ...] = (
    ("ImageNet-scale pre-training (all three papers pre-train on ImageNet-scale data and models)",
     "our sources are CIFAR-10 models (ResNet-20, 12-block ViTs) pre-trained on this machine or a 15-minute GPU "
     "lease; no ImageNet-scale data is on this machine, and no GPU time at that scale was available",
     "GPU time beyond the GPU headline issue's; not planned"),
    ("the papers' transfer claims (a DP continual-pretrained or publicly pre-trained model transfers to other "
     "tasks)",
     "every Bu et al. and Ganesh et al. row scores the pre-training task's own test split; only Ke et al.'s rows "
     "transfer (to the 10-class Food-101 slice)",
     "a linear probe / fine-tune of the continual arm's checkpoints on Food-101 or SVHN (both under "
     "`../shared/data`); not built"),
    ("Ke et al.: the transient feature distortion on STL-10 (features distort early in full fine-tuning from a "
     "random head, then recover)",
     "there is no STL-10 under `../shared/data`, and nothing downloads data at run time; the kNN-quality curves of "
     "`seed_arms/cpu_vit_ke/ke.json` (Food-101) are the nearest measurement, not the paper's setting",
     "STL-10 added to the shared data, then `python -m experiments arms run ke` on a scale whose downstream is it"),
    ("Ganesh et al.: public pre-training is necessary for private training but not for non-private training "
     "(the private-vs-non-private contrast), at full size (`gpu_full`)",
     "the arm's `nondp` part (the private steps without DP after 0 and after the largest public budget) ran at "
     "`cpu_hour` only (its row); at `gpu_full` it is two 1,000-step trainings a seed of ResNet-20 on this CPU, and "
     "no GPU time was lent to this session",
     "on a GPU lease as for the control above (the queue runs the parts not yet in `results/seed_arms/gpu_full/"
     "parts/`), or on this CPU `python -m experiments arms run ganesh --scale gpu_full --seeds 0 1 2 3 4 --parts "
     "nondp`, then `python -m experiments findings`"),
    ("Ganesh et al.: the shared-random-init control at full size (`gpu_full`)",
     "the control ran at `cpu_hour` (its row); at `gpu_full` it is the same work as the arm's `random` part (two "
     "DP runs and a barrier){random_cost}, beyond this session's budget",
     "on a GPU lease: copy `results/reference/seed_arms/gpu_full/parts/` to `results/seed_arms/gpu_full/parts/` "
     "(so the queue skips what ran), then `python -m experiments gpu run --scale gpu_full --arms ganesh --no-runs`, "
     "then here `python -m experiments arms merge ganesh --scale gpu_full`; or on this CPU `python -m experiments "
     "arms run ganesh --scale gpu_full --seeds 0 1 2 3 4 --parts same_random`"),
    ("the representation-law study: untuned DP fine-tuning collapses (the law breaks down without tuning)",
     "our untuned runs use a default learning rate that already works (untuned and tuned accuracies agree in the "
     "law rows), so the collapse was never provoked",
     "the paper's untuned hyper-parameters as the arm's untuned setting; not built"),
    ("Bu et al.: continual checkpoints resist the strongest membership attacks (LiRA / RMIA, TPR at 1 % and 0.1 % "
     "FPR; `attacks/strongest.py`) at full size (`gpu_full`)",
     "the continual arm kept no weights and no per-example scores, only LOSS / Attack-P summaries with TPR at 1 % "
     "FPR (`seed_arms/gpu_full/continual.json`); LiRA and RMIA need reference models trained like the target on "
     "other halves of the same private pool. The membership arm does that "
     "(`experiments/arms/membership.py`){mia_cost}, so at `gpu_full` it is 16 ResNet-20 trainings of 1,000 steps "
     "per training: a GPU lease",
     "a `gpu_full` scale of the membership arm (as `cpu_hour_mia` is for `cpu_hour`) and the arm in the GPU "
     "queue's list (`ARM_ORDER` in `experiments/gpu/queue.py`), then a lease; neither is defined"),
    ("Bu et al.: the paper's switch, early stopping on validation loss, at full size (`gpu_full`) without our cap",
     "our plateau rule implements it but caps public steps at twice the scale's `switch` (400 of 1,000 at "
     "`gpu_full`), and the validation loss still fell at the cap on every seed; only `cpu_hour` (the small CNN) "
     "ran it with a larger cap (its row)",
     "a `gpu_full` scale of the continual arm's plateau part with a larger `switch` (the cap is `2 * scale.switch` "
     "in `experiments/arms/bu.py`), as `cpu_hour_plateau` is for `cpu_hour`: on a GPU lease `python -m experiments "
     "gpu run --scale gpu_full --arms continual --no-runs --arm-scale continual=<that scale>`; not defined"),
    ("Ke et al. at `gpu_full`: the budget-split rows' per-seed runs{ke_reference_claim}",
     "the 50 DP runs were not archived: their run directories are gone, `gpu_full_runs.tgz` holds only the "
     "continual config's runs and `ft_source_gpu_full.tgz` only the source, so only "
     "`finetune_strategies.gpu_full.md`'s rounded mean ± SD survives, which the rows test (Welch from the summary; "
     "their verdicts rest on that table){ke_reference_why}",
     "on this CPU `python -m experiments papers run finetune --scale gpu_full --variants 'lp-e*' 'fft-e*' "
     "'lpfft*'` after `python -m experiments gpu prepare --jpeg`, `gpu decode` and `gpu unpack "
     "results/reference/seed_gpu/ft_source_gpu_full.tgz` (the table's Machine line: 204 minutes of training), "
     "then `python -m experiments findings`, which keeps their per-seed values in `seed_findings.per_seed.json`"),
)


def _random_part_cost() -> str:
    """What the Ganesh et al. arm's ``random`` parts at ``gpu_full`` took on this CPU, from their part files."""
    import json

    from experiments.findings.rows import OUT

    parts = sorted((OUT / "seed_arms/gpu_full/parts").glob("ganesh.s*.random.json"))
    walls = [json.loads(p.read_text()) for p in parts]
    secs = [w["wall_seconds"] for w in walls if w.get("device") == "cpu"]
    if not secs:
        return ""
    return (f", which took {min(secs):,.0f}-{max(secs):,.0f} s a seed on one core of this CPU "
            f"(`seed_arms/gpu_full/parts/ganesh.s*.random.json`), {sum(secs) / 3600:.1f} hours for {len(secs)} seeds")


def _membership_cost() -> str:
    """Where the membership arm ran and what it took, from its committed JSON (empty without one)."""
    import json

    from experiments.findings.rows import OUT

    done = sorted((OUT / "seed_arms").glob("*_mia/membership.json"))
    if not done:
        return ": not run at any scale"
    m = json.loads(done[0].read_text())
    n = len(m.get("summary", {})) * m["targets"]
    return (f" and ran at `{m['scale_settings']['name'].removesuffix('_mia')}` (its row; {n} small-CNN models in "
            f"{m['wall_seconds']:,.0f} s wall on one thread of this shared CPU, "
            f"`seed_arms/{done[0].parent.name}/membership.json`)")


def _ke_missing() -> list[str]:
    """The strategies (LP, FFT) of Ke et al.'s table at ``gpu_full`` without an archived non-DP reference."""
    from experiments.findings.finetune import NONDP_REFERENCE, nondp_reference

    have = nondp_reference("gpu_full")
    return [label for k, label in NONDP_REFERENCE if k not in have]


def _ke_reference_claim() -> str:
    missing = _ke_missing()
    if not missing:
        return ""
    return ", and a non-DP reference on the downstream task" + ("" if len(missing) == 2 else f" for {missing[0]}")


def _ke_reference_why() -> str:
    missing = _ke_missing()
    if not missing:
        return ("; the non-DP reference (`lp-nondp`, `fft-nondp` of `finetune_strategies.yaml`) ran since and is "
                "archived (`seed_findings.per_seed.json`)")
    if len(missing) == 1:
        return (f"; of the non-DP reference (`lp-nondp`, `fft-nondp` of `finetune_strategies.yaml`) only the other "
                f"strategy ran (`seed_findings.per_seed.json`), so DP's cost for {missing[0]} has no reference")
    return "; no non-DP fine-tuning of the source on Food-101 was run, so DP's cost there has no reference"


_FILL = {"{random_cost}": _random_part_cost, "{mia_cost}": _membership_cost,
         "{ke_reference_claim}": _ke_reference_claim, "{ke_reference_why}": _ke_reference_why}


def untested_section() -> list[str]:
    """The section's lines: a heading, one sentence on what it is, one bullet per claim."""
    lines = ["## Untested", "",
             "Claims of the seed papers that no row above tests, why, and what would test them. A row that could not "
             "have failed is not in the table.", ""]
    for claim, why, what in UNTESTED:
        for key, fill in _FILL.items():
            why = why.replace(key, fill()) if key in why else why
            claim = claim.replace(key, fill()) if key in claim else claim
        lines.append(f"* **{claim}.** Why: {why}. To test it: {what}.")
    return lines + [""]
