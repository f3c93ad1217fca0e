"""The prose of ``results/reference/seed_findings.md`` around its table: the scales, and what the rows say in words.

Kept apart from :mod:`seed_findings` (which computes every number in the table) because it is written by hand after
reading a run's table: when the numbers change, re-read the table and update these paragraphs.
"""

SCALE_NOTE = [
    "**Scales.** Each row names the scale it was measured at; a group of claims uses the largest scale that has "
    "results.",
    "",
    "* `gpu_full`: one lent NVIDIA H200, 15 minutes of device time (one 500 s command, then a 143 s one that "
    "resumed the queue). All of CIFAR-10 carried as JPEG (`seed_gpu.py prepare --jpeg`, decoded there). The "
    "continual-pretraining config at issue 16's sizes: ResNet-20, 20,000 private images, 1,000 steps of batch 256 "
    "with random crops and flips in every phase, 10,000 test images, 5 seeds; the switch-point sweep {0, 50, 100, "
    "200, 400} public steps (5,000 public images drawn apart from the private pool, 2,780 left after dropping "
    "copies of private ones), σ by PLD for the DP steps left so every arm has ε = 8 (δ = 1e-6), and the non-DP "
    "baseline with tr(H) every 250 steps. **The non-DP baseline is a real model: 64.3 ± 2.7 % over 5 seeds, every "
    "seed above 60 %** (60.1-67.2 %). 30 runs, 99 minutes of training, 6-12 at a time with the GPU busy 98-100 % "
    "(`seed_gpu/gpu_full/`). The continual arm (σ = 0, plateau rule, membership inference) ran at the same sizes "
    "on a later H200 lease: 25 jobs (5 seeds × non-DP, clipping-only, DP from scratch, continual with 200 public "
    "steps, plateau rule), 12 at a time, in a 465 s command and a 163 s one, the GPU busy 88 % "
    "(`seed_gpu/gpu_full_continual/`). Its runs train on a random half of the 20,000 private images (10,000 "
    "members, the other half the attack's non-members), σ = 0.815 for 1,000 DP steps at ε = 8, δ = 1e-5 (PLD). "
    "The config's 5 decelerator-rule runs (`continual-dec`) did not fit a lease and ran on this 2-core CPU "
    "instead, through the same job queue: the same config, data and seeds, one thread per run, 31-46 minutes each.",
    "* `gpu`: one lent NVIDIA H100 80GB, for the 30 minutes of device time a session gets (three commands). The "
    "continual-pretraining config's switch-point sweep {0, 50, 100, 200, 400} public steps of 1,000 at batch 256 "
    "(ResNet-20, 8,000 private CIFAR-10 images, 2,000 disjoint public ones, 2,000 test images), 5 seeds, σ by PLD "
    "for the DP steps left so every arm has ε = 8 (δ = 1e-5), plus 2 seeds of non-DP training with tr(H). "
    "Non-DP ResNet-20 on these 8,000 images without augmentation reaches only 43 % (96 % train accuracy: it "
    "overfits), because the machine's 64 MiB upload held 13,000 CIFAR-10 images; `gpu_full` above is the re-run "
    "on all of them. Throughput (`seed_gpu/h100_profile.txt`): one process alone takes 103 ms per DP step "
    "(Opacus hooks; 73 ms with bk; non-DP 15 ms) of which only ~16 ms are GPU kernels, so the step is host-bound; "
    "8-12 processes sharing the GPU reach ~50 DP steps/s together with the GPU busy 99-100 % of the time "
    "(`seed_gpu/h100_utilisation.csv`). The arms (σ = 0, plateau, membership, tr(H), Ke, Ganesh) need ~120,000 DP "
    "steps at this scale, about 40 minutes of the whole GPU: they did not fit and ran at `cpu_hour` instead.",
    "* `cpu_hour`: the issue's fallback, the largest scale that fits about an hour of this shared 2-core CPU: 5 "
    "seeds, 300 DP steps, the 24k-parameter CNN, σ by PLD, tr(H) with 32 probes on 256 held-out test images. Arms: "
    "2,000 private images at batch 64 (the membership arm trains on a random half); configs: 4,000 private images "
    "at batch 128 and the sweep {0, 15, 30, 60, 120} public steps of 300. Non-DP reaches about 33-37 %: a weak "
    "model, so a verdict here is about this small CNN, not about the papers' settings. The fine-tuning configs "
    "(Ke et al.'s budget split) at `cpu_hour`: the small CNN trained non-DP for 3,000 steps on 10,000 public "
    "CIFAR-10 images (53.7 %), then 1,000 DP steps of batch 125 per strategy on the 3,750 Food-101 images, ε ∈ {1, "
    "8} by RDP, 5 seeds (50 runs, 35 min of training).",
    "* `cpu_vit_long`: the ViT arm on this 2-core CPU with a pre-trained model past the issue's 60 %. The 12-block "
    "ViT of width 64 (4 heads, 8×8 patches: 16 tokens plus the class token, 614k parameters) is pre-trained once, "
    "non-DP, for 16,000 steps of batch 128 on 22,500 public CIFAR-10 images with crops and flips and a cosine "
    "learning rate (400 warm-up steps; 38 minutes on one core): 60.9 % on the arm's 1,000 test images, 63.9 % on "
    "all 10,000 (`python benchmarks/seed_arms.py pretrained --scale cpu_vit_long` scores the jobs' cached model on "
    "the whole test split). Every seed starts from that one model "
    "and varies the fine-tuning's batches and noise and the search. For each ε ∈ {1, 3, 8, ∞}, 300 fine-tuning "
    "steps of batch 128 on 5,000 disjoint private images, σ by PLD (1.888 / 0.976 / 0.658, δ = 1e-5), DP steps "
    "by book-keeping. Tuned runs use a 3-trial × 50-step learning-rate search on 2,500 further public images "
    "(half to train, half to score), so tuning costs no privacy. Per-block statistics on 1,000 held-out test "
    "images. 20 (seed, ε) jobs of about 2.5 minutes each on one core (`seed_gpu.py run --scale gpu_full --arms vit "
    "--no-runs --arm-scale vit=cpu_vit_long`, which shares the pre-training between the jobs).",
    "* `cpu_vit_ke`: Ke et al.'s arm on this 2-core CPU with a source past the issue's 60 %: `cpu_vit_long`'s "
    "pre-trained ViT (60.9 % on the arm's 1,000 CIFAR-10 test images, 63.9 % on all 10,000; the same cached model, "
    "not trained again), DP fine-tuned on the 10-class Food-101 slice: 2,500 private images, 500 held-out "
    "validation images (the split selection and the kNN queries, against a bank of 1,000 private images), 1,000 "
    "test images. Every run has 1,000 full fine-tuning steps of batch 128 at ε = 8 (δ = 1e-5, PLD; σ = 1.21 for "
    "FFT alone), learning rate 1e-3 (AdamW) with the head's ×5 by parameter group; LP-FFT adds 500 head-only steps "
    "before them and splits ε between the phases (25 / 50 / 75 % to LP), DP-LP alone takes 1,500 head-only steps "
    "at the whole ε. DP steps by book-keeping. 30 (seed, run) jobs of 3-9 minutes on one core "
    "(`seed_gpu.py run --scale gpu_full --arms ke --no-runs --arm-scale ke=cpu_vit_ke`).",
    "* `gpu_full_vit` (its rows left the table for `cpu_vit_long`'s, whose pre-trained model is past 60 %; its "
    "JSON stays in `seed_arms/`): the ViT arm on one lent NVIDIA H200, in one 444 s command (20 (seed, ε) jobs "
    "at once, the "
    "GPU busy 91 % on average; `seed_gpu/gpu_full_vit/`). ViT-Tiny's width, heads and depth (192 × 3 × 12, 5.4M "
    "parameters) on 8×8 patches (16 tokens plus the class token), pre-trained non-DP for 2,000 steps of batch 256 "
    "on 18,000 public CIFAR-10 images with crops and flips (44.8 ± 2.1 % on the 10,000 test images). Then, for each"
    " ε ∈ {1, 3, 8, ∞}, 300 fine-tuning steps of batch 256 on 20,000 disjoint private images, σ by PLD (1.167 / "
    "0.754 / 0.543, δ = 1e-5), DP steps by book-keeping. Tuned runs use a 3-trial × 50-step learning-rate search "
    "on 2,000 further public images, so tuning costs no privacy. Per-block statistics on 1,000 held-out test "
    "images.",
    "* `cpu_hour_vit` (superseded: its rows left the table, its JSON stays in `seed_arms/`): "
    "the ViT arm on this CPU, 5 seeds, about 21 minutes per seed on one core. The model is a "
    "12-block ViT of width 64 (4 heads) on 8×8 patches (16 tokens plus the class token), 614k parameters. It is "
    "pre-trained non-DP for 2,000 steps of batch 128 on 18,000 public CIFAR-10 images (46.4 ± 1.6 % test "
    "accuracy). Then, for each ε ∈ {1, 3, 8, ∞}, it is fine-tuned 300 steps on 5,000 disjoint private images, σ by "
    "PLD (1.888 / 0.976 / 0.658). Tuned runs use a 3-trial learning-rate search of 50 steps each on 2,000 further "
    "public images, so tuning costs no privacy. The per-block statistics use 1,000 held-out test images.",
    "* `cpu`: the 60-100-step scale of the previous table (2-3 seeds, RDP); only rows no larger scale measured.",
    "",
    "A verdict is 'reproduced' or 'not reproduced' only when its pre-set test (Welch's t, corrected where several "
    "comparisons or a best-of choice were made) rejects at 0.05; 'inconclusive' otherwise.",
]

IN_WORDS = [
    "## In words", "",
    "* **Switch point at full size (`gpu_full`, 5 seeds, non-DP 64.3 %).** At equal ε and equal total steps, more "
    "public steps before DP help all the way to the grid's end: 41.7 % with none, 40.6 / 43.8 / 48.3 / 53.7 % after"
    " 50 / 100 / 200 / 400 public steps (400 vs 0: Welch, Holm over 4, p < 0.001; +12.0 points on every seed). 50 "
    "steps sit 1.1 points *below* none (paired by seed, Holm p = 0.022, descriptive). The public images here are "
    "in-distribution CIFAR-10, so a public step is nearly a non-DP step, and the issue's grid stops before the "
    "curve turns: the best switch point is at or beyond 400 of 1,000. The non-DP run's tr(H) on 256 held-out images "
    "rises from its (negative, indefinite) value at initialisation to a peak at step 500 (690 ± 102) and falls to "
    "588 ± 35 at step 1,000; the fall just clears the pre-set two standard errors on a 250-step grid.",
    "* **The decelerator rule at full size (`gpu_full`, 5 seeds): not reproduced.** The rule switches to DP once "
    "σ²·tr(H)/(B·c²) falls below 1, with tr(H) estimated every 50 public steps on 256 public images (32 probes) "
    "and the σ the remaining steps would get. It fired at its first check on every seed: after 50 public steps, "
    "at a decelerator of 0.54 ± 0.11 (tr(H) 320 ± 63). Those runs reach 40.2 ± 0.8 %, as the sweep's 50-step "
    "point does (40.6 ± 0.7 %), below DP from scratch (41.7 ± 0.6 %, Welch p = 0.011) and 13.5 points below the "
    "sweep's best, 400 public steps (53.7 %; Welch, Bonferroni × 5 for picking the best, p < 0.001). The rule "
    "reads the decelerator as if it started high and fell (the paper's picture: DP noise hurts most early, where "
    "tr(H) is large). Here tr(H) starts negative and is still small and rising at step 50, so a level threshold "
    "fires at once, at the sweep's worst point. The curvature peaks only at step 500 (the non-DP run), and the "
    "sweep still gains at 400: a rule that waited for the peak would not be contradicted by these runs, but that "
    "is not the rule the paper states, and we did not run it. Under DP the held-out tr(H) keeps rising (740 ± 220 "
    "at step 1,000 against 588 ± 35 non-DP), so the decelerator grows from 0.85 to 1.25 over the DP phase. At "
    "`cpu_hour` the same rule never fired (below); at `gpu` (2 seeds, read off the non-DP run's tr(H), no run) "
    "it would have switched at its cap of 400 while the best was at 100.",
    "* **Switch point (`gpu`, 8,000 images, 5 seeds).** At equal ε and equal total steps, 100 public steps before "
    "DP give the best mean (41.5 % vs 38.3 % with none), and the curve falls again at 200-400 (39.1 %, 38.4 %): "
    "public steps help up to a point, then eat the DP budget's steps. With the pre-set Welch test and Holm over the"
    " four switch points this is not significant (p = 0.070); paired by seed (one initialisation per seed in every "
    "arm) the +3.3 points at 100 steps are consistent on all five seeds (Holm p = 0.009), which we report as "
    "descriptive only.",
    "* **Continual pre-training (`cpu_hour`, 5 seeds, the configs).** At equal ε and total steps, 60 public steps "
    "then 240 DP steps beat 300 DP steps from scratch (28.1 % vs 23.4 %, Holm p < 0.001), and the small CNN's sweep "
    "rises to its largest point (120 of 300 public steps: 32.7 %, Holm p = 0.003); the GPU sweep's hump (best at "
    "100 of 1,000, falling after) is what a model that learns from its DP steps shows, the small CNN is not there.",
    "* **Noise, the plateau rule and membership at full size (`gpu_full`, the continual arm, 5 seeds).** Noise, "
    "not clipping, carries most of the DP loss: clipping alone (σ = 0) costs 4.1 points against non-DP (59.9 ± 1.4 "
    "% vs 64.1 ± 1.1 %, 95 % CI [2.3, 5.9]), the noise a further 19.8 (DP from scratch 40.1 ± 0.8 %, p < 0.001). "
    "The arm's continual run (200 public steps, then 800 DP steps) reaches 48.1 ± 0.6 % and the plateau rule's run "
    "54.3 ± 1.1 %: the configs' sweep at 200 and 400 public steps gave 48.3 % and 53.7 % through a separate code "
    "path. The plateau rule never fired: the public validation loss still fell at its cap of 400 steps, so its row"
    " is inconclusive, as at `cpu_hour`. The LOSS attack's AUC is 0.502-0.504 on every DP checkpoint against 0.534 "
    "± 0.005 for non-DP (p < 0.001), and its TPR at 1 % FPR is 1.0 %, chance. The clipping-only model leaks as "
    "much as the non-DP one (AUC 0.533, TPR 1.2 %): clipping without noise buys no membership privacy. The same "
    "three rows at `cpu_hour` (small CNN) agreed: clip-only 28.0 % vs DP 20.7 %, AUC 0.501 vs 0.546.",
    "* **Reproduced at `cpu_hour`:** public pre-training is necessary (Ganesh et al.: 300 public steps give 33.4 % "
    "vs 19.8 % with none) and DP runs from one public initialisation stay in one basin (no loss barrier between "
    "them, 0.28 between runs from random inits).",
    "* **Against the paper:** tr(H) on held-out images is *larger* in DP fine-tuning from a public model than in "
    "DP pre-training from scratch (1,381 vs 580 over the run, p < 0.001). Bu et al.'s argument compares trained "
    "states; our fine-tuning starts from a model 400 non-DP steps into training, which sits in a sharper region "
    "than a random initialisation, and the small CNN is far from their models.",
    "* **Not exercised:** neither switch rule fired at `cpu_hour`. The decelerator σ²·tr(H)/(B·c²) stayed above "
    "its threshold and the public validation loss kept improving, so both arms switched at their cap (120 public "
    "steps): their rows say only that more public steps helped, and whether the rule picks the sweep's best point "
    "is untested. At `gpu_full` the plateau rule again ran to its cap (400 public steps); the decelerator rule "
    "fired, too early (above).",
    "* **Representation law (`cpu_vit_long`, a 12-block ViT pre-trained to 63.9 %, 5 seeds).** The prediction "
    "residual decays geometrically over the 12 blocks at every ε: R² 0.96-0.97 at ε = 1, 3, 8 and 0.94 non-DP, "
    "ρ ≈ 0.981 per block, every interval above the pre-set bar of 0.9, so reproduced. Per-block fuzziness D falls "
    "faster (ρ ≈ 0.834) but fits at R² 0.89-0.90 under DP and 0.87 ± 0.01 non-DP: inconclusive at ε = 1, 3, 8 and "
    "under the bar without DP, so that row is inconclusive. The misfit is a floor, not noise: D falls smoothly and "
    "flattens over the last blocks (seed 0, ε = 1: 424, 230, 151, 121, 92, 79, 66, 58, 51, 46, 44, 44), and the "
    "pre-trained model has the same profile before any fine-tuning (432, 233, 153, ..., 45; its own fit R² 0.885, "
    "ρ 0.829). DP fine-tuning leaves the profile and the accuracy where pre-training put them (60.9 ± 0.5 % at "
    "ε = 1 untuned, from 60.9 %), while non-DP fine-tuning on the 5,000 private images loses 3 points (57.8 ± "
    "1.4 %). Privacy does not measurably slow the separation (ρ 0.836 at ε = 1 vs 0.833 non-DP, p = 0.57), tuning "
    "does not make the law hold better (Holm p ≥ 0.44), and the public learning-rate search does not improve "
    "accuracy at any ε (Holm p ≥ 0.44): 50 trial steps scored on 1,250 public images pick rates from 1.7e-4 to "
    "2.6e-3 across seeds, and the larger picks cost 2-3 points. ViT-Tiny's width (192) on an H200 "
    "(`gpu_full_vit`, pre-trained to only 44.8 %) agreed on D (R² 0.83-0.89, inconclusive), on privacy and on "
    "tuning, but there the prediction residual barely fell (ρ ≈ 0.993, R² ≈ 0.8): the residual law shows on the "
    "model that learned more before fine-tuning. The DP noise is there (a check on this CPU, the 192-wide ViT on "
    "512 images: 20 DP steps at σ = 1.167 move the weights as far as 20 clipping-only steps, AdamW normalising the "
    "step, but in an orthogonal direction, cosine 0.001; `tests/test_seed_arm_vit.py` keeps that invariant); the "
    "pre-trained model absorbs it.",
    "* **Ke et al.'s budget split (`cpu_hour`, 1,000 steps, 5 seeds).** DP-LP-FFT beats DP-FFT at ε = 1 (27.8-29.6 "
    "% vs 23.2 %, Holm p = 0.003) and, barely, at ε = 8 (38.7-39.7 % vs 34.7 %, Holm p = 0.048): LP first helps "
    "against full fine-tuning, as the paper says. It does not beat DP-LP: at ε = 1 linear probing alone is better "
    "(33.5 %, Holm p = 0.017 against the best split), and at ε = 8 they tie (38.6 %). On this small CNN the "
    "backbone has little to gain from DP updates. At 300 steps the picture was the same (a run kept in the "
    "session note, not in the table).",
    "* **Within the noise:** Ke et al.'s head-alignment and feature-distortion claims (LP-aligned 27.5 % vs random "
    "26.2 %, kNN 28.2 % vs 27.5 %), and the validation-selected LP-FFT split against FFT (+1.2 points).",
    "",
]

LEFT_OUT = [
    "**Still short of the issue.** The ViT rows now come from a 12-block ViT pre-trained past 60 % (`cpu_vit_long`, "
    "63.9 % on the 10,000 test images), but a narrow one (width 64, 614k parameters) trained on this CPU; "
    "ViT-Tiny's width (192) reached only 45 % in the 2,000 pre-training steps one lease held (`gpu_full_vit`). "
    "The next ViT lease pre-trains one shared ViT-Tiny for 8,000 cosine-scheduled steps with crops and flips "
    "(`gpu_full_vit_long`), the recipe that took the 64-wide ViT from 45.7 % to 59.7 % at 8,000 steps and to "
    "60.9 % at 16,000 on more images (`vit_pretrain_probe*.md`, `cpu_vit_long`). The geometric law on the 3-block "
    "CNN (`transfer.md`) is inconclusive as well: 3 points per fit leave 1 residual degree of freedom. The non-DP "
    "baseline above 60 % is met by the `gpu_full` continual config (64.3 %), the continual arm (64.1 %) and the "
    "decelerator-rule runs, but the tr(H), Ke et al. and Ganesh et al. arms have not run at that size: their rows "
    "are from `cpu_hour`, where non-DP is 33-37 %. The tr(H) arm is running at `gpu_full` part by part on this "
    "CPU between leases (its finished parts in `seed_arms/gpu_full/parts/`; seed 0's non-DP pre-training reaches "
    "68.0 % after 1,500 steps); about 13 hours of one core in all. `results/reference/seed_gpu/LEASES.md` plans "
    "the leases left: about 500-700 s of the whole GPU per arm, one arm a lease, and the ViT-Tiny again with one "
    "shared 8,000-step pre-training (`gpu_full_vit_long`).",
]
