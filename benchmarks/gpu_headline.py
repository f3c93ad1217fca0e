"""Issue 32's headline: the audit at the scale it is sold for, in one command on one lent H100/H200.

Stages, in this order, each in its own process with its own deadline (seconds from the start; what a stage had
finished is kept when its deadline stops it), and ``--out`` re-written with every stage's rows as soon as the
stage ends (and copied to ``--copy-to``, so a command cut at the device's limit still returns what finished):

a. **target**: ``eval_configs/cifar10_fastnet.yaml`` (``model.arch: fastnet``, the whitened fast convnet of
   :mod:`training.models.fastnet`, and its recipe keys), the LiRA protocol: pool = the CIFAR-10 training images
   of ``--data`` (45,000 here: the shared copy holds 45,000 of the 50,000), members Bernoulli(1/2), test accuracy
   on the 10,000 test images; goal >= 92 %.
b. **references**: first a concurrency probe (the reference recipe's model trained W at a time: one after another,
   W CUDA streams in one process, W processes; the batched ``torch.func`` engine does not apply to BatchNorm
   nets) whose fastest way then trains K = 16 reference models with the target's recipe (then K = 64 when the
   deadline leaves room), and ``audit attack`` scores LiRA online / offline and RMIA on 18 queries (the image,
   its flip, +-1 pixel shifts): AUC and TPR at 1 %, 0.1 %, 0.01 % FPR with bootstrap intervals. Goals: target
   + 16 references <= 3 minutes; LiRA online AUC >= 0.69, TPR@0.1 % >= 5.9 % (the LiRA paper's 16-model demo).
c. **dp_target**: ``eval_configs/cifar10_fastnet_dp.yaml`` (epsilon 8, delta 1e-5, bk clipping, 5,000 gradient
   canaries): test accuracy and the one-run epsilon lower bound (``audit epsilon --sources gradient_canaries``).
d. **step_table**: ViT-S and ResNet-20 at batch 256: ms per step and GPU busy % (profiler kernel time over wall)
   of one process, non-DP vs DP hooks / ghost / bk and the fused fixed-shape step (:mod:`training.dp.fused`).
   Goals: one DP process keeps the GPU >= 80 % busy; ViT-S DP step with bk <= 1.3x non-DP.

GPU busy % of stages a-c is NVML's utilisation sampled every 0.5 s over the stage (the share of time a kernel
ran); peak memory is torch's ``max_memory_allocated`` in the stage's main process and NVML's device-wide peak.

**A lease** (the device tool's ``run``). Here, once, in the checkout the session sends (its ignored paths travel
only when carried): ``python -m experiments gpu prepare --jpeg`` (all of CIFAR-10 as JPEG,
``.device_data/cifar10.jpeg.npz``, 52 MiB) and the wheels the device lacks, into ``.whl/`` (both git-ignored)::

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl opacus==1.6.0 dp-accounting==0.6.0 \
        dm-tree==0.1.10 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5

(3.3 MiB; torch, timm, scipy, scikit-learn, PyYAML, safetensors, click, rich, nvidia-ml-py are on the device).
Then ``run`` with ``carry`` = [".whl", ".device_data/cifar10.jpeg.npz"], ``timeout_s`` 600 and the command::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && python3 -m experiments gpu decode && python3 benchmarks/gpu_headline.py --data .device_data/cifar10_full --budget 540 --copy-to $OUT

(``--budget`` counts from this script's start; ``decode`` takes ~10 s before it, the machine's start is not
counted in ``timeout_s``.) What comes back under
``files_at``: ``gpu_headline.md`` (the table) and ``gpu_headline.json`` (every stage's raw result); copy the
table to ``results/reference/gpu_headline.md`` here and commit it before anything else (issue 32, item 4).

The issue asks for the trade-off of fast recipes (they memorise less) rather than an audit tuned to the demo's
number: once this table holds GPU figures, a later call (or lease) runs the same line with ``--set
training.epochs=8 --skip dp_target step_table --out results/reference/gpu_headline.e8.md`` (8 instead of 16
epochs: accuracy, time, AUC and TPR side by side).

**Smoke** (``--smoke``): every stage at toy size on the CPU in under 2 minutes (synthetic images, tiny models),
written to ``results/gpu_headline_smoke.md`` — never to the reference table. ``tests/test_gpu_headline.py``
runs it (marked slow), so the command does not rot between leases.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _headline_render import render  # noqa: E402

REFERENCE_OUT = ROOT / "results/reference/gpu_headline.md"
SMOKE_OUT = ROOT / "results/gpu_headline_smoke.md"
STAGES = ("target", "references", "dp_target", "step_table")
#: each stage's deadline as a share of --budget (cumulative); a stage that ends early leaves its time to the next
DEADLINES = {"target": 0.17, "references": 0.62, "dp_target": 0.82, "step_table": 0.99}
VIT_S = {"arch": "vit_small_patch16_224", "cifar_stem": True}
RESNET20 = {"arch": "resnet20_cifar", "fix_batchnorm": True}
SMOKE_DATA = ["data.dataset=synthetic", "data.split=train:n=192,classes=4,size=16",
              "data.test_split=test:n=96,classes=4,size=16", "data.root=null"]


def settings_for(args: argparse.Namespace, work: Path) -> dict[str, dict]:
    """Each stage's settings (the GPU sizes, or the toy sizes of ``--smoke``)."""
    common = {"device": "cpu" if args.smoke else "auto", "seed": args.seed, "cwd": str(ROOT),
              "threads": 1 if args.smoke else 4}
    target_dir = work / "headline-target"
    base = [f"output_dir={work}", "training.progress=false", f"training.seed={args.seed}",
            f"training.device={common['device']}"]
    if args.smoke:
        data = SMOKE_DATA
        target_over = base + data + ["name=headline-target", "model.kwargs={widths: [8, 16, 16], whiten_images: 64}",
                                     "training.epochs=null", "training.steps=8", "training.batch_size=32",
                                     "training.physical_batch_size=64", "optim.warmup_steps=2",
                                     "training.precision=fp32", "training.channels_last=false"]
        dp_data = [d.replace("size=16", "size=32") for d in data]  # GroupNorm needs > 1 value per group at the end
        dp_over = base + dp_data + ["name=headline-dp", "model.kwargs={widths: [4, 8, 8], whiten_images: 0}",
                                 "training.steps=4", "training.batch_size=32", "training.physical_batch_size=32",
                                 "training.gradient_canaries={count: 32, seed: 0}",
                                 "privacy.target_epsilon=null", "privacy.noise_multiplier=0.7",
                                 "training.channels_last=false"]
        ref = {"n_reference": [2, 4], "probe_models": 2, "probe_steps": 2, "probe_side": 16, "probe_batch": 16,
               "probe_kwargs": {"widths": [8, 16, 16]}, "shifts": 1, "n_bootstrap": 20, "population": 64,
               # one after another: spawning trainer processes costs ~20 s each on a busy CPU (the processes executor
               # has its own test, tests/test_shadows.py); the probe still measures all three ways
               "force_way": {"2": "sequential", "4": "sequential"}}
        table = {"table_models": {"ViT (tiny)": {"arch": "vit_tiny_patch16_224", "cifar_stem": True,
                                                 "kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2}},
                                  "ResNet-20": RESNET20},
                 "table_side": 8, "table_batch": 8, "table_steps": 2, "table_warmup": 1, "table_profiled": 1,
                 "table_physical": {}}
    else:
        root = Path(args.data).resolve()
        data = [f"data.root={root}"]
        target_over = base + data + ["name=headline-target"] + list(args.set)
        dp_over = base + data + ["name=headline-dp"] + list(args.set_dp)
        ref = {"n_reference": [16, 64], "probe_models": 4, "probe_steps": 30, "probe_side": 32, "probe_batch": 1024,
               "probe_kwargs": {"widths": [64, 256, 256]}, "shifts": 1, "n_bootstrap": 200, "population": "all",
               "signal_batch_size": 4096}
        table = {"table_models": {"ViT-S": VIT_S, "ResNet-20": RESNET20}, "table_side": 32, "table_batch": 256,
                 "table_steps": 25, "table_warmup": 5, "table_profiled": 10,
                 "table_physical": {"vit_small_patch16_224": 64}}
    modes = ["non-DP", "hooks", "ghost", "bk", "fused"]
    return {
        "target": {**common, "config": str(ROOT / "eval_configs/cifar10_fastnet.yaml"), "overrides": target_over},
        "references": {**common, **ref, "run_dir": str(target_dir), "probe_arch": "fastnet"},
        "dp_target": {**common, "config": str(ROOT / "eval_configs/cifar10_fastnet_dp.yaml"), "overrides": dp_over},
        "step_table": {**common, **table, "table_modes": modes, "table_reserve": 5 if args.smoke else 15,
                       "table_compile": [] if args.smoke else ["ResNet-20"]},
    }


class NvmlSampler:
    """GPU utilisation (% of time a kernel ran) and device memory sampled every ``period`` s in a thread."""

    def __init__(self, period: float = 0.5) -> None:
        self.period, self.samples, self.mem_peak = period, [], 0
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - no NVML (a CPU): no utilisation figures
            self._nvml = None
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self) -> NvmlSampler:
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._h).gpu)
                self.mem_peak = max(self.mem_peak, self._nvml.nvmlDeviceGetMemoryInfo(self._h).used)
            except Exception:  # noqa: BLE001
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> dict:
        if not self.samples:
            return {"busy": None, "nvml_peak_bytes": None}
        return {"busy": sum(self.samples) / len(self.samples) / 100, "nvml_peak_bytes": self.mem_peak}


def run_stage(name: str, settings: dict, work: Path, deadline_at: float) -> dict:
    """Run one stage in a child process until it ends or ``deadline_at`` (time.time()); its result or what it
    had written so far, with wall time, status, busy % and peak memory."""
    settings = {**settings, "deadline_at": deadline_at, "partial": str(work / f"{name}.partial.json")}
    spath, opath = work / f"{name}.settings.json", work / f"{name}.json"
    spath.write_text(json.dumps(settings))
    t0 = time.time()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"),
                                                         os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": str(settings.get("threads", 1))}
    cmd = [sys.executable, "-c", "import sys; from _headline_stages import main_stage; from pathlib import Path; "
           "main_stage(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))", name, str(spath), str(opath)]
    with NvmlSampler() as nvml:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(1.0, deadline_at - time.time()))
            status = "done" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the stage and the processes it started
            proc.wait()
            status = "stopped at its deadline"
    result = json.loads(opath.read_text()) if opath.exists() else (
        json.loads(Path(settings["partial"]).read_text()) if Path(settings["partial"]).exists() else {})
    return {"name": name, "status": status, "wall": time.time() - t0, **nvml.summary(), "result": result}


def device_line(smoke: bool) -> str:
    import torch

    from training.device import device_name, is_cuda, resolve_device, total_memory_bytes

    dev = resolve_device("auto")
    if is_cuda(dev) and not smoke:
        return (f"{device_name(dev)} ({total_memory_bytes(dev) / 2**30:.0f} GiB), torch {torch.__version__}, "
                f"Python {platform.python_version()}")
    return (f"CPU ({os.cpu_count()} cores visible), torch {torch.__version__}, Python {platform.python_version()}: "
            "the --smoke toy run, not GPU figures")


def run(args: argparse.Namespace) -> Path:
    """Every stage in order; the table re-written after each. Returns the table's path."""
    from training.device import is_cuda, resolve_device

    out = Path(args.out or (SMOKE_OUT if args.smoke else REFERENCE_OUT))
    if args.smoke and out.resolve() == REFERENCE_OUT.resolve():
        raise ValueError(f"--smoke writes toy CPU figures: not to {REFERENCE_OUT} (use another --out)")
    if not args.smoke and not is_cuda(resolve_device("auto")):
        raise ValueError("gpu_headline.py measures a GPU and none is visible; on a CPU run --smoke")
    if not args.smoke and not (Path(args.data) / "train.npz").is_file():
        raise ValueError(f"--data {args.data} holds no train.npz: run `python3 -m experiments gpu decode` first")
    t_start = time.time()
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-headline-"))
    work.mkdir(parents=True, exist_ok=True)
    settings = settings_for(args, work)
    done: list[dict] = []
    dev = device_line(args.smoke)
    for name in STAGES:
        if name in args.skip:
            continue
        deadline_at = t_start + DEADLINES[name] * args.budget
        if deadline_at - time.time() < 5:
            done.append({"name": name, "status": "not started: no time left", "wall": 0.0, "result": {}})
        else:
            print(f"[{time.time() - t_start:5.0f} s] stage {name} (deadline {deadline_at - t_start:.0f} s)", flush=True)
            done.append(run_stage(name, settings[name], work, deadline_at))
            print(f"[{time.time() - t_start:5.0f} s] stage {name}: {done[-1]['status']}", flush=True)
        text = render(done, device=dev, smoke=args.smoke, budget=args.budget, command=" ".join(sys.argv))
        _write(out, text)
        if args.copy_to:
            dest = Path(args.copy_to)
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out, dest / out.name)
            (dest / "gpu_headline.json").write_text(json.dumps(done, indent=1, default=str))
    return out


def _write(path: Path, text: str) -> None:
    from foundation.io import write_text

    write_text(path, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="every stage at toy size on the CPU (< 2 minutes)")
    p.add_argument("--data", default=str(ROOT / ".device_data/cifar10_full"),
                   help="CIFAR-10 folder (train.npz, test.npz, classes.txt): `python -m experiments gpu decode` writes it")
    p.add_argument("--budget", type=float, default=540.0, help="seconds for all stages together")
    p.add_argument("--out", default=None, help=f"the table (default {REFERENCE_OUT.relative_to(ROOT)}, "
                                               f"--smoke: {SMOKE_OUT.relative_to(ROOT)})")
    p.add_argument("--copy-to", default=None, help="folder the table and raw results are copied to after each "
                                                  "stage (on the device: $OUT)")
    p.add_argument("--work", default=None, help="folder for the run directories (default: a new temporary one)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", nargs="*", default=[], choices=STAGES, help="stages to leave out")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="target config override")
    p.add_argument("--set-dp", action="append", default=[], metavar="KEY=VALUE", help="DP target override")
    args = p.parse_args(argv)
    try:
        print(f"wrote {run(args)}")
    except ValueError as exc:  # a refusal: one line, exit code 2
        p.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
