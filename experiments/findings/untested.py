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
     "FPR; `attacks/strongest.py`)",
     "the continual arm kept no weights and no per-example scores, only LOSS / Attack-P summaries with TPR at 1 % "
     "FPR (`seed_arms/<scale>/continual.json`); LiRA and RMIA need the target models and reference models trained "
     "on other halves of the same private pool, i.e. the 25 target trainings again plus the references{arm_cost}: "
     "more than this session's CPU budget at `cpu_hour` and a GPU lease at `gpu_full`",
     "the arm saving its models (safetensors) and scoring them with the suite's LiRA / RMIA over a reference-model "
     "farm of the same recipe; not built"),
    ("Bu et al.: the paper's switch, early stopping on validation loss, at full size (`gpu_full`) without our cap",
     "our plateau rule implements it but caps public steps at twice the scale's `switch` (400 of 1,000 at "
     "`gpu_full`), and the validation loss still fell at the cap on every seed; only `cpu_hour` (the small CNN) "
     "ran it with a larger cap (its row)",
     "a `gpu_full` scale of the continual arm's plateau part with a larger `switch` (the cap is `2 * scale.switch` "
     "in `experiments/arms/bu.py`), as `cpu_hour_plateau` is for `cpu_hour`: on a GPU lease `python -m experiments "
     "gpu run --scale gpu_full --arms continual --no-runs --arm-scale continual=<that scale>`; not defined"),
    ("Ke et al. at `gpu_full`: the budget-split rows' per-seed runs, and a non-DP reference on the downstream task",
     "the 50 runs were not archived (only `finetune_strategies.gpu_full.md`'s mean ± SD, which the rows test); no "
     "non-DP fine-tuning of the source on Food-101 was run, so DP's cost there has no reference",
     "`python -m experiments gpu run --scale gpu_full --arms --configs finetune` (GPU, or a CPU with "
     "`--workers 2`), then `python -m experiments gpu pack FILE` to keep the runs; the non-DP reference needs a "
     "strategy "
     "without DP in `finetune_strategies.yaml` (not in the config)"),
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


def _continual_arm_cost() -> str:
    """What the continual arm at ``cpu_hour`` (25 models and their LOSS / Attack-P scoring) took, from its JSON."""
    import json

    from experiments.findings.rows import OUT

    path = OUT / "seed_arms/cpu_hour/continual.json"
    if not path.is_file():
        return ""
    secs = json.loads(path.read_text())["wall_seconds"]
    return (f" (the `cpu_hour` arm's 25 models took {secs:,.0f} s on this CPU, `seed_arms/cpu_hour/continual.json`; "
            "k reference models per target multiply that by about k + 1)")


_FILL = {"{random_cost}": _random_part_cost, "{arm_cost}": _continual_arm_cost}


def untested_section() -> list[str]:
    """The section's lines: a heading, one sentence on what it is, one bullet per claim."""
    lines = ["## Untested", "",
             "Claims of the seed papers that no row above tests, why, and what would test them. A row that could not "
             "have failed is not in the table.", ""]
    for claim, why, what in UNTESTED:
        for key, fill in _FILL.items():
            why = why.replace(key, fill()) if key in why else why
        lines.append(f"* **{claim}.** Why: {why}. To test it: {what}.")
    return lines + [""]
