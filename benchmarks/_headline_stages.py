"""The four stages of :mod:`gpu_headline`, each a function of a JSON-able settings dict returning a JSON-able dict.

Each runs in its own process (the driver kills it at the stage's deadline), through the product's own entry
points: ``audit.api.train`` / ``attack`` / ``epsilon`` and :func:`training.dp.engine.make_stepper`, plus the fused
step of :mod:`training.dp.fused` for the DP-step table. ``settings`` carries the sizes (the GPU run's or the
``--smoke`` toy sizes), so the smoke run exercises exactly these functions.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from training.device import empty_cache, is_cuda, on_new_stream, reset_peak_memory, synchronize

ROOT = Path(__file__).resolve().parents[1]
ATTACKS = ("lira_online", "lira_offline", "rmia_offline")
FPRS = ("0.01", "0.001", "0.0001")


def _device(settings: dict) -> torch.device:
    from training.device import resolve_device

    return resolve_device(settings["device"])


def _peak(device: torch.device) -> int | None:
    from training.device import peak_memory_bytes

    return peak_memory_bytes(device)


# ------------------------------------------------------------------------------------------------- a. target

def target(settings: dict) -> dict:
    """Stage a: the non-DP target (LiRA protocol) from the fast recipe; test accuracy and time."""
    from audit import api

    t0 = time.perf_counter()
    result = api.train(settings["config"], overrides=settings["overrides"], overwrite=True)
    m = result.manifest
    return {"run_dir": str(result.run_dir), "seconds": time.perf_counter() - t0,
            "test_accuracy": result.metrics.get("test_accuracy"), "train_accuracy": result.metrics.get("train_accuracy"),
            "arch": m.model.arch, "params": m.model.param_count, "pool": int(m.data.pool_size),
            "members": int(m.data.membership.n_members), "steps": int(sum(p.steps for p in m.privacy.phases)) or None,
            "peak_bytes": _peak(_device(settings))}


# ------------------------------------------------------------------------------------- b. reference models

def _probe_model(settings: dict, device: torch.device):
    from training.config import ModelConfig
    from training.models import build_model

    cfg = ModelConfig(arch=settings["probe_arch"], kwargs=settings["probe_kwargs"], fix_batchnorm=False)
    side = settings["probe_side"]
    return build_model(cfg, num_classes=10, input_shape=(3, side, side), seed=0).module.to(device)


def _probe_train(settings: dict, device: torch.device, steps: int) -> None:
    """``steps`` plain steps of the reference recipe's model and batch (bf16 where it runs) on device data."""
    model = _probe_model(settings, device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    side, b = settings["probe_side"], settings["probe_batch"]
    x = torch.rand(b, 3, side, side, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (b,), device=device)
    bf16 = is_cuda(device)
    for _ in range(steps):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    float(loss.detach())  # one sync at the end


def _probe_process(settings: dict, steps: int, barrier, queue) -> None:
    """One probe process: warm up, wait for the others, then time ``steps`` steps; (ready, done) times to ``queue``."""
    torch.set_num_threads(1)
    device = _device(settings)
    _probe_train(settings, device, 2)
    ready = time.time()
    barrier.wait()
    t0 = time.time()
    _probe_train(settings, device, steps)
    queue.put((ready, t0, time.time()))


def _mp_method(settings: dict, device: torch.device) -> str:
    """spawn on CUDA (never fork a process holding CUDA); fork on the CPU (the smoke run: fast) unless set."""
    return settings.get("mp_method") or ("spawn" if is_cuda(device) else "fork")


def concurrency_probe(settings: dict, *, plan_models: int, plan_steps: int) -> dict:
    """How to train ``plan_models`` reference models of ``plan_steps`` steps fastest: the reference recipe's
    network trained W at a time one after another in one process, on W CUDA streams from W threads of one
    process, or in W processes. Each way's steady rate (model-steps per second, after a warm-up) and start-up
    (processes: spawning, imports, the first steps), and the time they project for the plan; the fastest is
    chosen."""
    import multiprocessing as mp

    device = _device(settings)
    w, steps = settings["probe_models"], settings["probe_steps"]
    _probe_train(settings, device, 2)  # warm-up: kernels, cuDNN autotuning
    rates, startup = {}, {}
    t0 = time.perf_counter()
    for _ in range(w):
        _probe_train(settings, device, steps)
    rates["sequential"], startup["sequential"] = w * steps / (time.perf_counter() - t0), 0.0

    def one():
        with on_new_stream(device):
            _probe_train(settings, device, steps)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(w)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    way = "streams" if is_cuda(device) else "threads"
    rates[way], startup[way] = w * steps / (time.perf_counter() - t0), 0.0
    ctx = mp.get_context(_mp_method(settings, device))
    barrier, queue = ctx.Barrier(w), ctx.Queue()
    t_spawn = time.time()
    procs = [ctx.Process(target=_probe_process, args=(settings, steps, barrier, queue)) for _ in range(w)]
    for p in procs:
        p.start()
    times = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    if all(p.exitcode == 0 for p in procs):
        start, end = max(t[1] for t in times), max(t[2] for t in times)
        rates["processes"], startup["processes"] = w * steps / max(end - start, 1e-9), start - t_spawn
    projected = {k: startup[k] + plan_models * plan_steps / rates[k] for k in rates}
    best = min(projected, key=projected.get)
    return {"rates": rates, "startup": startup, "projected": projected, "plan": [plan_models, plan_steps],
            "best": best, "models": w, "steps": steps}


def _attack_row(report: dict) -> dict:
    out = {}
    for name in ATTACKS:
        m = report["attacks"][name]["metrics"]
        out[name] = {"auc": m["auc"], "auc_ci": m["auc_ci"], "n_nonmembers": m["n_nonmembers"],
                     "n_members": m.get("n_members"),
                     "tpr": {f: m["tpr_at_fpr"].get(f) for f in FPRS},
                     "tpr_ci": {f: (m.get("tpr_at_fpr_ci") or {}).get(f) for f in FPRS}}
    return out


def references(settings: dict) -> dict:
    """Stage b: the concurrency probe, then K = 16 reference models trained by the product's executor for the
    fastest usable way (``processes`` or ``sequential``; CUDA streams are measured, but no executor trains on
    them) and the attacks (LiRA online/offline, RMIA; 18 queries), then K = 64 when the stage's deadline leaves
    room for it."""
    from audit import api
    from training.run import open_run

    t_stage = time.perf_counter()
    deadline = settings["deadline_at"]
    run_dir = Path(settings["run_dir"])
    plan_steps = int(sum(p.steps for p in open_run(run_dir).manifest.privacy.phases))
    probe = concurrency_probe(settings, plan_models=settings["n_reference"][0], plan_steps=plan_steps)
    usable = {k: v for k, v in probe["projected"].items() if k in ("sequential", "processes")}
    best = min(usable, key=usable.get)
    out = {"probe": probe, "runs": [], "how": best}
    _write_partial(settings, out)
    per_model = None
    device = _device(settings)
    for k in settings["n_reference"]:
        how = settings.get("force_way", {}).get(str(k), best)  # the smoke run: each executor once
        left = deadline - time.time()
        if per_model is not None and per_model * k * 1.15 > left:
            out["skipped"] = f"K = {k}: ~{per_model * k:.0f} s of training needed, {left:.0f} s left"
            break
        overrides = [f"attack.n_reference={k}", f"attack.attacks=[{', '.join(ATTACKS)}]", "attack.flip=true",
                     f"attack.shifts={settings['shifts']}", f"attack.n_bootstrap={settings['n_bootstrap']}",
                     f"attack.seed={settings['seed']}", f"attack.device={settings['device']}",
                     f"attack.population={settings['population']}", f"attack.executor={how}",
                     f"attack.workers={settings['probe_models']}",
                     f"attack.signal_batch_size={settings.get('signal_batch_size', 512)}"]
        t0 = time.perf_counter()
        report = api.attack(run_dir, overrides=overrides, retrain_shadows=True).report.model_dump()
        wall = time.perf_counter() - t0
        t_train = float(report["setup"]["shadow_train_seconds"])
        per_model = t_train / k
        out["runs"].append({"k": k, "train_seconds": t_train, "attack_seconds": wall - t_train, "how": how,
                            "executor": report["setup"].get("executor"),
                            "queries": len(report["setup"]["augmentations"]), "attacks": _attack_row(report),
                            "peak_bytes": _peak(device)})
        _write_partial(settings, out)
    out["seconds"] = time.perf_counter() - t_stage
    return out


def _write_partial(settings: dict, out: dict) -> None:
    """What a stage has so far, for the driver to render if the deadline stops the stage."""
    from foundation.io import write_json

    write_json(Path(settings["partial"]), out)


# ---------------------------------------------------------------------------------------------- c. DP target

def dp_target(settings: dict) -> dict:
    """Stage c: the DP target (ε = 8, δ = 1e-5, bk, gradient canaries): accuracy and the one-run ε lower bound."""
    from audit import api

    t0 = time.perf_counter()
    result = api.train(settings["config"], overrides=settings["overrides"], overwrite=True)
    t_train = time.perf_counter() - t0
    report = api.epsilon(result.run_dir, sources="gradient_canaries")
    est = [e.to_entry().model_dump() for e in report.estimates]
    m = result.manifest
    return {"run_dir": str(result.run_dir), "train_seconds": t_train, "seconds": time.perf_counter() - t0,
            "test_accuracy": result.metrics.get("test_accuracy"), "epsilon": m.privacy.epsilon,
            "delta": m.privacy.delta, "sigma": m.privacy.phases[0].noise_multiplier,
            "steps": m.privacy.phases[0].steps, "q": m.privacy.phases[0].sample_rate,
            "estimates": [{"method": e["method"], "source": e["source"], "epsilon_lb": e["epsilon_lb"],
                           "alpha": e["alpha"]} for e in est],
            "verdict": str(report.verdict.status), "peak_bytes": _peak(_device(settings))}


# ------------------------------------------------------------------------------------------ d. DP-step table

def _busy(device: torch.device, fn, steps: int) -> float | None:
    """Share of the wall time of ``steps`` calls of ``fn`` in which the GPU ran kernels (profiler kernel time)."""
    if not is_cuda(device):
        return None
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        synchronize(device)
        wall = time.perf_counter() - t0
    kernel_us = sum(e.self_device_time_total for e in prof.key_averages())
    return min(1.0, kernel_us / 1e6 / wall)


def _step_fn(mode: str, model_cfg: dict, settings: dict, device: torch.device):
    """A zero-argument function taking one training step of ``mode`` on a fixed device batch, through the
    product's stepper (:func:`training.dp.engine.make_stepper`); ``fused`` pads to the batch itself (the Poisson
    capacity's padding is the run's, not the step's), ``fused+compile`` adds ``training.compile``."""
    from training.accel import Accel
    from training.config import ModelConfig, OptimConfig
    from training.dp.engine import make_stepper
    from training.dp.recipe import TrainRecipe
    from training.models import build_model

    side, b = settings["table_side"], settings["table_batch"]
    cfg = ModelConfig(**model_cfg)
    model = build_model(cfg, num_classes=10, input_shape=(3, side, side), seed=0).module.to(device)
    x = torch.rand(b, 3, side, side, device=device)
    y = torch.randint(0, 10, (b,), device=device)
    dp = mode != "non-DP"
    grad_mode = "fused" if mode.startswith("fused") else (mode if dp else "hooks")
    physical = settings["table_physical"].get(model_cfg["arch"], b) if grad_mode == "fused" else b
    recipe = TrainRecipe(steps=10 ** 6, batch_size=b, optim=OptimConfig(name="sgd", lr=0.01), dp=dp,
                         noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=grad_mode,
                         physical_batch_size=physical)
    st = make_stepper(model=model, recipe=recipe, sample_rate=0.01, generator=torch.Generator(device=device),
                      device=device, accel=Accel(compile=mode == "fused+compile"))
    if grad_mode == "fused":
        st.capacity = b
    return lambda: st.step(x, y)


def step_table(settings: dict) -> dict:
    """Stage d: ms per step (median) and GPU busy % of one process, per model and mode; the compiled rows
    (``table_compile``: compilation takes long) last. The rows so far are kept after each, for the deadline."""
    device = _device(settings)
    out = {"rows": []}
    todo = [(label, mode) for label in settings["table_models"] for mode in settings["table_modes"]]
    todo += [(label, "fused+compile") for label in settings.get("table_compile", [])]
    for label, mode in todo:
        model_cfg = settings["table_models"][label]
        if time.time() > settings["deadline_at"] - settings["table_reserve"]:
            out["rows"].append({"model": label, "mode": mode, "error": "not run: the stage's deadline"})
            continue
        row = {"model": label, "mode": mode}
        try:
            fn = _step_fn(mode, model_cfg, settings, device)
            times = []
            for _ in range(settings["table_steps"]):
                t0 = time.perf_counter()
                fn()
                synchronize(device)
                times.append(time.perf_counter() - t0)
            row["ms"] = 1000 * statistics.median(times[settings["table_warmup"]:])
            row["busy"] = _busy(device, fn, settings["table_profiled"])
            row["peak_bytes"] = _peak(device)
        except Exception as exc:  # a mode that fails is reported, the others still run
            row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        _write_partial(settings, out)
        empty_cache(device)
        reset_peak_memory(device)
    return out


STAGES = {"target": target, "references": references, "dp_target": dp_target, "step_table": step_table}


def main_stage(name: str, settings_path: Path, out_path: Path) -> None:
    """Run stage ``name`` with the settings in ``settings_path``; write its result to ``out_path``."""
    from foundation.io import write_json

    settings = json.loads(settings_path.read_text())
    torch.set_num_threads(settings.get("threads", 1))
    os.chdir(settings.get("cwd", ROOT))
    sys.path.insert(0, str(ROOT))
    write_json(out_path, STAGES[name](settings))
