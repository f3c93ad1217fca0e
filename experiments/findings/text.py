"""The prose of ``results/reference/seed_findings.md`` around its table: the scales, and what the rows say in words.

Every measured figure in it (accuracies, tr(H), p-values, σ, AUCs, barriers, R², part counts and times) is read
from the result files by :func:`facts`, so re-made results re-make the sentences; what stays typed here is the
method (sizes, steps, grids a scale was set to run) and how the leases went (command lengths, GPU busy time), which
``results/reference/seed_gpu/LEASES.md`` records as they ran.
"""

from __future__ import annotations

from experiments.findings import facts_arms, facts_runs, facts_scales, facts_tables, membership
from experiments.findings.prose import _PROSE, paragraphs
from experiments.findings.prose_law import CLOSING, PROSE


def facts() -> dict:
    """Every figure the prose quotes, computed from the result files (a group whose files are absent is left out)."""
    f: dict = {}
    for group in (facts_runs.switch_gpu_full, facts_runs.switch_gpu, facts_runs.continual_cpu_hour,
                  facts_runs.gpu_full_scale, facts_arms.continual_arm, facts_arms.ganesh, facts_arms.ganesh_control, facts_arms.ganesh_contrast,
                  facts_arms.plateau_room, membership.facts,
                  facts_arms.trace,
                  facts_arms.vit, facts_arms.ke, facts_tables.budget_split, facts_tables.h100_profile,
                  facts_scales.vit_scales, facts_scales.gpu_scale):
        f.update(group())
    arm_cfg = [f.pop(k) for k in ("cas_nondp_mean", "ch_nondp_mean") if k in f]
    if arm_cfg:  # cpu_hour's non-DP baselines: the arms' and the configs' means
        f["ch_nondp_means"] = f"{100 * min(arm_cfg):.0f}-{100 * max(arm_cfg):.0f}"
    means = f.pop("gf_sweep_means", {})
    if "ca_switch" in f and means:  # the configs' sweep at the arm's switch and at its plateau cap
        f["gf_at_arm_switch"] = means.get(int(f["ca_switch"]), "?")
        f["gf_at_arm_cap"] = means.get(int(f["ca_plateau_cap"]), "?")
    return f


def _gpu_full(f: dict) -> str:
    return (
        "* `gpu_full`: one lent NVIDIA H200, 15 minutes of device time (one 500 s command, then a 143 s one that "
        "resumed the queue). All of CIFAR-10 carried as JPEG (`experiments gpu prepare --jpeg`, decoded there). The "
        "continual-pretraining config at issue 16's sizes: ResNet-20, 20,000 private images, 1,000 steps of batch 256 "
        "with random crops and flips in every phase, 10,000 test images, 5 seeds; the switch-point sweep {0, 50, 100, "
        "200, 400} public steps (5,000 public images drawn apart from the private pool, "
        f"{f['gfs_public_left']} left after dropping copies of private ones), σ by PLD for the DP steps left so every "
        "arm has ε = 8 (δ = 1e-6), and the non-DP baseline with tr(H) every 250 steps. **The non-DP baseline is a real "
        f"model: {f['gfs_nondp']} % over 5 seeds, {f['gfs_all_above']}** ({f['gfs_nondp_span']} %). "
        f"{f['gfs_runs']} runs, {f['gfs_minutes']} minutes of training, 6-12 at a time with the GPU busy 98-100 % "
        "(`seed_gpu/gpu_full/`). The continual arm (σ = 0, plateau rule, membership inference) ran at the same sizes "
        "on a later H200 lease: 25 jobs (5 seeds × non-DP, clipping-only, DP from scratch, continual with 200 public "
        "steps, plateau rule), 12 at a time, in a 465 s command and a 163 s one, the GPU busy 88 % "
        "(`seed_gpu/gpu_full_continual/`). Its runs train on a random half of the 20,000 private images "
        f"({f['ca_members']} members, the other half the attack's non-members), σ = {f['ca_sigma']} for 1,000 DP "
        "steps at ε = 8, δ = 1e-5 (PLD). The config's 5 decelerator-rule runs (`continual-dec`) did not fit a lease "
        "and ran on this 2-core CPU instead, through the same job queue: the same config, data and seeds, one thread "
        f"per run, {f['gfs_dec_minutes']} minutes each. The fine-tuning config (Ke et al.'s budget split) at "
        "`gpu_full` ran on this CPU too: its source is ResNet-20 trained without DP on all 45,000 CIFAR-10 training "
        f"images (crops and flips, 3,000 steps of batch 256, {f['bs_source']} % on the 10,000 test images), and its "
        f"{f['bs_runs']} DP fine-tunings (LP, FFT, LP-FFT at 25/50/75 % of ε; ε = 1 and 8; 5 seeds) take 1,000 steps "
        "of batch 125 on the Food-101 slice (3,000 training and 600 test images, 32×32), per-example gradients by "
        "bk, two runs at a time, 90-575 s each.")


def _gpu(f: dict) -> str:
    return (
        "* `gpu`: one lent NVIDIA H100 80GB, for the 30 minutes of device time a session gets (three commands). The "
        "continual-pretraining config's switch-point sweep {0, 50, 100, 200, 400} public steps of 1,000 at batch 256 "
        "(ResNet-20, 8,000 private CIFAR-10 images, 2,000 disjoint public ones, 2,000 test images), 5 seeds, σ by PLD "
        "for the DP steps left so every arm has ε = 8 (δ = 1e-5), plus 2 seeds of non-DP training with tr(H). "
        f"Non-DP ResNet-20 on these 8,000 images without augmentation reaches only {f['gs_nondp']} % "
        f"({f['gs_nondp_train']} % train accuracy: it overfits), because the machine's 64 MiB upload held 13,000 "
        "CIFAR-10 images; `gpu_full` above is the re-run on all of them. Throughput (`seed_gpu/h100_profile.txt`): "
        f"one process alone takes {f['prof_hooks']} ms per DP step (Opacus hooks; {f['prof_bk']} ms with bk; non-DP "
        f"{f['prof_nondp']} ms) of which only ~16 ms are GPU kernels, so the step is host-bound; 8-12 processes "
        "sharing the GPU reach ~50 DP steps/s together with the GPU busy 99-100 % of the time "
        "(`seed_gpu/h100_utilisation.csv`). The arms (σ = 0, plateau, membership, tr(H), Ke, Ganesh) need ~120,000 DP "
        "steps at this scale, about 40 minutes of the whole GPU: they did not fit and ran at `cpu_hour` instead.")


def _cpu_hour(f: dict) -> str:
    return (
        "* `cpu_hour`: the issue's fallback, the largest scale that fits about an hour of this shared 2-core CPU: 5 "
        "seeds, 300 DP steps, the 24k-parameter CNN, σ by PLD, tr(H) with 32 probes on 256 held-out test images. Arms: "
        "2,000 private images at batch 64 (the membership arm trains on a random half); configs: 4,000 private images "
        f"at batch 128 and the sweep {{0, 15, 30, 60, 120}} public steps of 300. Non-DP reaches about "
        f"{f['ch_nondp_means']} %: a weak model, so a verdict here is about this small CNN, not about the papers' "
        "settings. The fine-tuning configs (Ke et al.'s budget split) at `cpu_hour`: the small CNN trained non-DP for "
        f"3,000 steps on 10,000 public CIFAR-10 images ({f['bss_source']} %), then 1,000 DP steps of batch 125 per "
        f"strategy on the 3,750 Food-101 images, ε ∈ {{1, 8}} by RDP, 5 seeds ({f['bss_runs']} runs, "
        f"{f['bss_minutes']} min of training).")


def _gpu_full_vit_long(f: dict) -> str:
    return (
        "* `gpu_full_vit_long`: the ViT arm at ViT-Tiny's width past the issue's 60 %, on one lent NVIDIA H100 80GB "
        "(one 565 s command, `seed_gpu/gpu_full_vit_long/`) and this CPU. ViT-Tiny's width, heads and depth (192 × 3 "
        "× 12, 5.4M parameters) on 8×8 patches (16 tokens plus the class token), pre-trained once, non-DP, for 8,000 "
        "steps of batch 256 on 18,000 public CIFAR-10 images with crops and flips and a cosine learning rate (400 "
        f"warm-up steps; ~210 s alone on the GPU): {f['gvl_pre']} % on the 10,000 test images. Every seed starts from "
        "that one model and varies the fine-tuning's batches and noise and the search. For each ε ∈ {1, 3, 8, ∞}, 300 "
        f"fine-tuning steps of batch 256 on 20,000 disjoint private images, σ by PLD ({f['gvl_sigmas']}, δ = "
        "1e-5), DP steps by book-keeping. Tuned runs use a 3-trial × 50-step learning-rate search on 2,000 further "
        "public images, so tuning costs no privacy. Per-block statistics on 1,000 held-out test images. The lease ran "
        f"the pre-training and {f['gvl_lease_jobs']} of the {f['gvl_jobs']} (seed, ε) jobs (20 at once; its deadline "
        f"stopped the other {f['gvl_cpu_jobs']} seconds short); the {f['gvl_cpu_jobs']} ran on this CPU from the "
        f"lease's weights (`experiments arms adopt`), one thread each, about {f['gvl_cpu_minutes']} minutes a job, two "
        f"at a time ({f['gvl_cpu_secs']} s). The JSON's `mixed_machines` says which part ran where.")


def _cpu_vit_long(f: dict) -> str:
    return (
        "* `cpu_vit_long` (its rows left the table for `gpu_full_vit_long`'s, the wider ViT; its pre-trained model is "
        "still `cpu_vit_ke`'s source): the ViT arm on this 2-core CPU with a pre-trained model past the issue's 60 %. "
        "The 12-block ViT of width 64 (4 heads, 8×8 patches: 16 tokens plus the class token, 614k parameters) is "
        "pre-trained once, non-DP, for 16,000 steps of batch 128 on 22,500 public CIFAR-10 images with crops and "
        f"flips and a cosine learning rate (400 warm-up steps; 38 minutes on one core): {f['cvl_pre']} % on the arm's "
        "1,000 test images (its score on all 10,000 was printed once by `python -m experiments arms pretrained "
        "--scale cpu_vit_long`, but neither that output nor the cached model was kept, so it is not quoted). Every seed starts from that one model "
        "and varies the fine-tuning's batches and noise and the search. For each ε ∈ {1, 3, 8, ∞}, 300 fine-tuning "
        f"steps of batch 128 on 5,000 disjoint private images, σ by PLD ({f['cvl_sigmas']}, δ = 1e-5), DP steps "
        "by book-keeping. Tuned runs use a 3-trial × 50-step learning-rate search on 2,500 further public images "
        "(half to train, half to score), so tuning costs no privacy. Per-block statistics on 1,000 held-out test "
        "images. 20 (seed, ε) jobs of about 2.5 minutes each on one core (`experiments gpu run --scale gpu_full "
        "--arms vit --no-runs --arm-scale vit=cpu_vit_long`, which shares the pre-training between the jobs).")


def _cpu_vit_ke(f: dict) -> str:
    return (
        "* `cpu_vit_ke`: Ke et al.'s arm on this 2-core CPU with a source past the issue's 60 %: `cpu_vit_long`'s "
        f"pre-trained ViT ({f['cvl_pre']} % on the arm's 1,000 CIFAR-10 test images; the same cached model, not "
        "trained again), DP fine-tuned on the 10-class Food-101 slice: 2,500 "
        "private images, 500 held-out validation images (the split selection and the kNN queries, against a bank of "
        "1,000 private images), 1,000 test images. Every run has 1,000 full fine-tuning steps of batch 128 at ε = 8 "
        "(δ = 1e-5, PLD; σ = 1.21 for FFT alone), learning rate 1e-3 (AdamW) with the head's ×5 by parameter group; "
        "LP-FFT adds 500 head-only steps before them and splits ε between the phases (25 / 50 / 75 % to LP), DP-LP "
        "alone takes 1,500 head-only steps at the whole ε. DP steps by book-keeping. 30 (seed, run) jobs of 3-9 "
        "minutes on one core (`experiments gpu run --scale gpu_full --arms ke --no-runs --arm-scale ke=cpu_vit_ke`).")


def _gpu_full_vit(f: dict) -> str:
    return (
        "* `gpu_full_vit` (its rows left the table for `gpu_full_vit_long`'s, whose pre-trained model is past 60 %; "
        "its JSON stays in `seed_arms/`): the ViT arm on one lent NVIDIA H200, in one 444 s command (20 (seed, ε) "
        "jobs at once, the GPU busy 91 % on average; `seed_gpu/gpu_full_vit/`). ViT-Tiny's width, heads and depth "
        "(192 × 3 × 12, 5.4M parameters) on 8×8 patches (16 tokens plus the class token), pre-trained non-DP for 2,000 "
        f"steps of batch 256 on 18,000 public CIFAR-10 images with crops and flips ({f['gv_pre']} % on the 10,000 "
        "test images). Then, for each ε ∈ {1, 3, 8, ∞}, 300 fine-tuning steps of batch 256 on 20,000 disjoint "
        f"private images, σ by PLD ({f['gv_sigmas']}, δ = 1e-5), DP steps by book-keeping. Tuned runs use a "
        "3-trial × 50-step learning-rate search on 2,000 further public images, so tuning costs no privacy. "
        "Per-block statistics on 1,000 held-out test images.")


def _cpu_hour_vit(f: dict) -> str:
    return (
        "* `cpu_hour_vit` (superseded: its rows left the table, its JSON stays in `seed_arms/`): the ViT arm on this "
        f"CPU, 5 seeds, about {f['chv_minutes_per_seed']} minutes per seed on one core. The model is a 12-block ViT "
        "of width 64 (4 heads) on 8×8 patches (16 tokens plus the class token), 614k parameters. It is pre-trained "
        f"non-DP for 2,000 steps of batch 128 on 18,000 public CIFAR-10 images ({f['chv_pre']} % test accuracy). "
        "Then, for each ε ∈ {1, 3, 8, ∞}, it is fine-tuned 300 steps on 5,000 disjoint private images, σ by PLD "
        f"({f['chv_sigmas']}). Tuned runs use a 3-trial learning-rate search of 50 steps each on 2,000 further "
        "public images, so tuning costs no privacy. The per-block statistics use 1,000 held-out test images.")


_SCALES = (_gpu_full, _gpu, _cpu_hour, _gpu_full_vit_long, _cpu_vit_long, _cpu_vit_ke, _gpu_full_vit, _cpu_hour_vit)


def sections(f: dict | None = None) -> tuple[list[str], list[str], list[str]]:
    """(the scale note, the words on the rows, the closing paragraph) as lines of ``seed_findings.md``."""
    f = facts() if f is None else f
    scale_note = [
        "**Scales.** Each row names the scale it was measured at; a group of claims uses the largest scale that has "
        "results.", "", *paragraphs(f, _SCALES),
        "* `cpu`: the 60-100-step scale of the previous table (2-3 seeds, RDP); only rows no larger scale measured.",
        "",
        "Verdicts are two-sided (`experiments/stats.py`): 'reproduced' when the pre-set test (Welch's t, corrected "
        "where several comparisons or a best-of choice were made) rejects at 0.05 in the paper's direction, 'not "
        "reproduced' when it rejects in the other, 'inconclusive' otherwise. Where a paper claims two settings give "
        "the same result, the test is an equivalence test (TOST against a margin the row states): 'reproduced' when "
        "the 90 % interval of the difference lies inside the margin, 'not reproduced' when the difference is shown "
        "to exceed it. A test that cannot fail is not run as one: a claim we could not test is listed under "
        "Untested, with why."]
    in_words = ["## In words", "", *paragraphs(f, _PROSE + PROSE), ""]
    return scale_note, in_words, paragraphs(f, CLOSING)
