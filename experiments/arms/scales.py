"""The named scales of the seed papers' extra arms (:class:`experiments.arms.common.ArmScale`): what each ran as,
with the measurements that sized it. ``python -m experiments arms run ARM --scale NAME`` runs one."""

from __future__ import annotations

from experiments.arms.common import ArmScale

#: the named scales; ``cpu`` finishes in minutes on a shared 2-core CPU, ``full`` is issue 16's (≥ 1,000 steps,
#: 5 seeds, a non-DP CIFAR-10 model above 60 % needs the ResNet and a GPU)
SCALES = {
    "cpu": ArmScale(name="cpu", private=1000, public=500, val=300, test=500, batch_size=64, steps=60, switch=20,
                    source_steps=150, public_steps=(0, 10, 30, 100), seeds=(0, 1), hessian_batch=256,
                    hessian_probes=8, hessian_every=20, trace_steps=80, knn_every=20, barrier_points=7,
                    accountant="rdp", vit_trials=3, vit_trial_steps=10, vit_probe_images=500),
    "full": ArmScale(name="full", arch="resnet20_cifar", private=20000, public=5000, val=2000, test=10000,
                     batch_size=256, steps=1000, switch=200, source_steps=3000, public_steps=(0, 10, 30, 100, 300),
                     seeds=(0, 1, 2, 3, 4), hessian_batch=256, hessian_probes=32, hessian_every=50, trace_steps=1500,
                     knn_every=100, barrier_points=21, accountant="pld",
                     # the ViT arm: ViT-Tiny width, pre-trained on the other 25,000 CIFAR-10 training images
                     vit_kwargs={"embed_dim": 192, "num_heads": 3, "depth": 12}, vit_lr=1e-3, vit_public=25000,
                     vit_tune_fraction=0.2, vit_trials=6, vit_trial_steps=200, vit_probe_images=1000),
    # what ran on one H100 (experiments/gpu/): the full scale on the 11,000 + 2,000 CIFAR-10 images and 3,600
    # Food-101 images that fit the GPU machine's 64 MiB upload (.device_data/, made by experiments gpu prepare)
    "gpu": ArmScale(name="gpu", root=".device_data/cifar10", downstream_root=".device_data/food101",
                    arch="resnet20_cifar", private=8000, public=2000, val=1000, test=2000, batch_size=256,
                    steps=1000, switch=200, source_steps=2000, public_steps=(0, 10, 30, 100, 300),
                    seeds=(0, 1, 2, 3, 4), hessian_batch=256, hessian_probes=32, hessian_every=50, trace_steps=1500,
                    knn_every=100, barrier_points=21, accountant="pld", downstream_private=2500, downstream_val=500,
                    vit_kwargs={"embed_dim": 192, "num_heads": 3, "depth": 12}, vit_lr=1e-3, vit_tune_fraction=0.2,
                    vit_trials=4, vit_trial_steps=100, vit_probe_images=1000),
}
# the largest CPU scale that fits about an hour of a shared 2-core CPU (issue 16's fallback when no GPU time is
# left): 5 seeds, 300 DP steps of batch 64 on 2,000 private images, tr(H) with 32 probes on 256 held-out images,
# σ by PLD; the ViT arm 200 steps per (ε, tuned/untuned), pre-trained on 1,800 of 3,000 public images
SCALES["cpu_hour"] = ArmScale(name="cpu_hour", private=2000, public=1000, val=500, test=1000, batch_size=64,
                              steps=300, switch=60, source_steps=400, public_steps=(0, 10, 30, 100, 300),
                              seeds=(0, 1, 2, 3, 4), hessian_batch=256, hessian_probes=32, hessian_every=50,
                              trace_steps=300, knn_every=50, barrier_points=11, accountant="pld",
                              downstream_private=2000, downstream_val=500, vit_public=3000, vit_trials=3,
                              vit_trial_steps=25, vit_probe_images=1000)
# the ViT arm on a 2-core CPU, sized so that the pre-trained model is a real one (about 50 % on CIFAR-10, not chance as
# the 32-wide ViT on 64 tokens and 1,800 images was): 12 blocks of width 64 on 8×8 patches (16 tokens + the class
# token), pre-trained for 2,000 steps of batch 128 on 18,000 public images (2,000 more are the search's tuning
# parts), then 300 steps per (ε, tuned/untuned) on 5,000 private images; 5 seeds, each about 20 minutes on one core
# (run two seed lists side by side: `run vit --scale cpu_hour_vit --seeds 0 2 4` and `--seeds 1 3`, then
# `merge vit --scale cpu_hour_vit`). Probes before the run, seed 0, 2,000 steps on all 20,000 public images, 1,000
# test images: width 64 49.0 %, width 96 45.5 % at twice the time, width 64 with crops and flips 47.1 % (too short
# a run to need them); the arm itself, on 18,000 images, pre-trains to 46.4 ± 1.6 % over 5 seeds
SCALES["cpu_hour_vit"] = SCALES["cpu_hour"].with_(
    name="cpu_hour_vit", private=5000, batch_size=128, steps=300, source_steps=2000, vit_public=20000,
    vit_kwargs={"embed_dim": 64, "num_heads": 4, "depth": 12, "patch_size": 8}, vit_lr=1e-3, vit_tune_fraction=0.1,
    vit_trials=3, vit_trial_steps=50, vit_probe_images=1000)
# issue 16's full scale on a GPU machine with all of CIFAR-10 carried as JPEG (`experiments gpu prepare --jpeg`, then
# `decode` there) and the 3,600-image Food-101 slice of `prepare` for the Ke et al. arm's downstream task; crops and
# flips in every phase, as in the configs' `gpu_full` scale (without them non-DP ResNet-20 stays under 60 %); tr(H)
# (256 held-out images, 32 probes) every 100 of the tr(H) arm's 1,500 steps, 16 points a curve: at every 50 the
# estimates (~1,000 fwd/bwd-equivalents a run) would double that arm's cost and its jobs would not fit one command.
# DP steps by book-keeping since 2026-11-26 (Opacus hooks before): the same clipped sums and noise draws, and since bk
# takes a Conv2d's per-example gradients from the grouped weight-gradient kernel ResNet-20's DP step costs half the
# hooks one on a CPU thread (1.5x a non-DP step; 73 vs 103 ms on the H100 before that change). The arm parts that ran
# earlier keep `hooks` in their settings; a merged arm lists who ran how under `mixed_settings`
SCALES["gpu_full"] = SCALES["full"].with_(name="gpu_full", root=".device_data/cifar10_full",
                                          downstream_root=".device_data/food101", downstream_private=2500,
                                          downstream_val=500, vit_public=20000, augment=True, hessian_every=100,
                                          grad_sample_mode="bk")
# the ViT arm for one 15-minute lease at gpu_full's data: ViT-Tiny's width, heads and depth (192, 3, 12; 5.4M
# parameters) on 8×8 patches (17 tokens, as `cpu_hour_vit`), pre-trained 2,000 steps of batch 256 on 18,000 public
# CIFAR-10 images with crops and flips (2,000 more are the search's parts), then per (ε, tuned/untuned) 300 steps on
# the 20,000 private images; a 3-trial × 50-step search on public data; 5 seeds, 1,000 probe images; DP steps by
# book-keeping (`grad_sample_mode: bk`, the same clipped sums as per-example gradients). About 11,000 DP steps and
# 10,000 non-DP ones in all. Measured on this 2-core CPU (2 threads, batch 256): the ViT's DP step takes 8.0 s with
# Opacus hooks, 1.25 s with bk (ghost clipping 1.96 s), its non-DP step 0.84 s; ResNet-20's DP step (hooks) 1.19 s,
# non-DP 0.25 s. So with bk a ViT DP step costs about what a ResNet-20 one does, ~20 ms of GPU time on the H100/H200
# leases: ~4 minutes of DP steps plus the pre-training, if 8-12 processes keep the GPU busy as they did. Pre-training
# probe on this CPU (seed 0, 2,000 steps, 29 min): 42.6 % on 2,000 test images. `experiments gpu run --scale gpu_full
# --arms vit --no-runs --workers 20` runs it as 20 (seed, ε) jobs sharing each seed's pre-training
# (`model_cache.cached_fit`): on an H200 (2026-11-26) all 20 at once finished in 432 s (pre-training 44.8 ± 2.1 % on
# the 10,000 test images; each DP fine-tuning run ~120 s, ~0.4 s a step with 20 processes sharing the GPU, 91 % busy)
SCALES["gpu_full_vit"] = SCALES["gpu_full"].with_(
    name="gpu_full_vit", steps=300, source_steps=2000, vit_public=20000, vit_tune_fraction=0.1,
    vit_kwargs={"embed_dim": 192, "num_heads": 3, "depth": 12, "patch_size": 8}, vit_lr=1e-3,
    vit_pretrain_augment=True, vit_trials=3, vit_trial_steps=50, vit_probe_images=1000, grad_sample_mode="bk")
# the ViT arm for the next lease: `gpu_full_vit` pre-trained each seed for 2,000 steps to 44.8 %, under the issue's
# 60 %; here one public model for all seeds (as a study of one public checkpoint has it; the seeds vary the
# fine-tuning and the search), so the lease's pre-training budget goes to one longer run: 8,000 steps, cosine with
# 400 warm-up steps, crops and flips. On this CPU the same recipe takes the 64-wide ViT from 45.7 % (2,000
# constant-rate steps) to 59.7 % (results/reference/vit_pretrain_probe.augment.md, 2 seeds).
# `experiments gpu run --scale gpu_full --arms vit --no-runs --arm-scale vit=gpu_full_vit_long`
SCALES["gpu_full_vit_long"] = SCALES["gpu_full_vit"].with_(
    name="gpu_full_vit_long", source_steps=8000, vit_shared_pretrain=True, vit_pretrain_schedule="cosine",
    vit_pretrain_warmup=400)
# the ViT arm on this 2-core CPU with a pre-trained model past issue 16's 60 %: `cpu_hour_vit`'s 64-wide 12-block ViT,
# one public pre-training for all seeds (as `gpu_full_vit_long`) of 16,000 cosine-scheduled steps (400 warm-up) with
# crops and flips on 22,500 public images (vit_public 25,000, a tenth of it the search's parts), where 8,000 steps on
# 18,000 images gave 59.7 % (vit_pretrain_probe.augment.md); DP steps by book-keeping (0.17 s a step against 0.27 s
# with Opacus hooks here, the same clipped sums). On this CPU, one thread a process: the pre-training 0.13 s a step
# (38 min, once), then 20 (seed, ε) jobs of ~2.5 minutes:
# `experiments gpu run --scale gpu_full --arms vit --no-runs --arm-scale vit=cpu_vit_long --workers 2`. Ran 2026-11-26:
# 60.9 % on the arm's 1,000 test images (a whole-test-split score printed then by `experiments arms pretrained --scale
# cpu_vit_long` was not kept, nor the model: no figure is quoted for it)
SCALES["cpu_vit_long"] = SCALES["cpu_hour_vit"].with_(
    name="cpu_vit_long", source_steps=16000, vit_public=25000, vit_pretrain_augment=True, vit_shared_pretrain=True,
    vit_pretrain_schedule="cosine", vit_pretrain_warmup=400, grad_sample_mode="bk")
# Ke et al.'s arm on a source past issue 16's 60 % on this CPU: `cpu_vit_long`'s pre-trained ViT (60.9 % on the arm's
# 1,000 CIFAR-10 test images; the same cache key, so `results/seed_arms/cpu_vit_long/pretrained/` copied to this scale's
# folder spares the 38-minute pre-training), DP fine-tuned on the 10-class Food-101 slice (2,500 private images, 500
# held-out validation ones for the split selection and the kNN queries, 1,000 test) for 1,000 FFT steps of batch
# 128 at ε = 8 (PLD), LP phases of 500 steps, the head's rate ×5 by parameter group, kNN quality every 100 steps;
# DP steps by book-keeping (0.17 s a step on one core). 30 (seed, run) jobs, ~2-4 minutes alone on one core (5-9
# beside three other jobs; ran 2026-11-26, 2 hours on the 2 cores shared with the tr(H) arm's parts):
# `experiments gpu run --scale gpu_full --arms ke --no-runs --arm-scale ke=cpu_vit_ke --workers 2`
SCALES["cpu_vit_ke"] = SCALES["cpu_vit_long"].with_(name="cpu_vit_ke", ke_source="vit", steps=1000, knn_every=100,
                                                    downstream_private=2500, downstream_val=500)
# the ViT arm as it fitted the last ~10 minutes of a 30-minute H100 lease: 3 seeds, 500 fine-tuning steps per
# (ε, tuned/untuned), a 96-wide 12-block ViT pre-trained for 1,000 steps on the 1,600 public pre-training images
SCALES["gpu_vit"] = SCALES["gpu"].with_(name="gpu_vit", steps=500, source_steps=1000, seeds=(0, 1, 2),
                                        vit_kwargs={"embed_dim": 96, "num_heads": 3, "depth": 12})
# the paper's switch (Bu et al.: early stopping on the public validation loss) with room to fire: the continual
# arm's plateau part at `cpu_hour`, its cap (2 × switch) raised from 120 to 240 of the 300 steps (validation loss
# every 40 steps, patience 2), everything else as `cpu_hour`, so its runs compare with `cpu_hour`'s scratch runs
# (same seeds, data and member halves). At 120 the loss still fell on every seed. Issue 36:
# `python -m experiments arms run continual --scale cpu_hour_plateau`
SCALES["cpu_hour_plateau"] = SCALES["cpu_hour"].with_(name="cpu_hour_plateau", switch=120, continual_arms=("plateau",))
# Bu et al.'s membership claim under the suite's strongest attacks (issue 36): the continual arm's `cpu_hour`
# trainings (non-DP, DP from scratch, continual with 60 public steps; 300 steps of batch 64 on a random half of the
# 2,000 private images, σ by PLD at ε = 8) 16 times each, model i with seed i on the continual arm's member half of
# seed i, every model attacked by LiRA / RMIA with the other 15 of its training as references (16 targets × 1,000
# non-members; 16,000 pooled). Its one "seed" is the run (`--seeds 0`), one part per training:
# `python -m experiments arms run membership --scale cpu_hour_mia --seeds 0 --parts nondp scratch continual`, then
# `python -m experiments arms merge membership --scale cpu_hour_mia`
SCALES["cpu_hour_mia"] = SCALES["cpu_hour"].with_(name="cpu_hour_mia", membership_models=16,
                                                  continual_arms=("nondp", "scratch", "continual"))
