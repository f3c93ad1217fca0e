"""One process alone on a GPU machine: seconds per step of the arms' loop non-DP, DP with Opacus hooks and DP with
``bk``, then the top device kernels of 12 DP steps (``python -m experiments gpu profile``)."""

from __future__ import annotations

import time
from pathlib import Path


def profile(steps: int, out: Path | None) -> None:
    """One process alone on the device: seconds per step of the arms' loop (ResNet-20, batch 256, the gpu scale's
    data) non-DP, DP with Opacus hooks and DP with ``bk``, then the top device kernels of 12 DP (hooks) steps."""
    import dataclasses
    import statistics

    import torch

    from experiments.arms.scales import SCALES
    from experiments.arms.common import build, load_arm_data, phase, train
    from training.device import resolve_device, synchronize

    dev = resolve_device("auto")
    scale = SCALES["gpu"]
    data = load_arm_data(scale, device=dev)
    lines = [f"device {dev}, torch {torch.__version__}, {steps} steps per mode (median of the last {steps - 10})"]

    def timed(sigma, mode, n, on=None):
        spec = phase("private", data.private, scale=scale, steps=n, sigma=sigma, seed=0, index=0)
        if mode:
            spec = dataclasses.replace(spec, privacy=spec.privacy.model_copy(update={"grad_sample_mode": mode}))
        stamps = []

        def hook(g, *_):
            synchronize(dev)
            stamps.append(time.perf_counter())
            if on:
                on(g)

        train(build(scale, data, seed=0, device=dev), [spec], seed=0, device=dev, on_step=hook)
        return statistics.median(b - a for a, b in zip(stamps[10:], stamps[11:]))

    for label, sigma, mode in (("non-DP", None, None), ("DP, hooks", 1.0, "hooks"), ("DP, bk", 1.0, "bk")):
        try:
            lines.append(f"{label}: {1000 * timed(sigma, mode, steps):.1f} ms/step")
        except Exception as exc:  # a mode that fails here is reported, the others still run
            lines.append(f"{label}: failed ({exc!r})"[:300])
        print(lines[-1], flush=True)
    from torch.profiler import ProfilerActivity, profile as tprofile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type != "cpu" else [])
    with tprofile(activities=acts) as prof:
        timed(1.0, "hooks", 12)
    key = "self_device_time_total" if dev.type != "cpu" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)
    print("\n".join(lines[1:]) + "\n" + table, flush=True)
    if out:
        out.write_text("\n".join(lines) + "\n\n" + table + "\n")
