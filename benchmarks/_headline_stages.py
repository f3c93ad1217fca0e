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

from training.device import (empty_cache, is_cuda, on_new_stream, reset_peak_memory, resolve_device,
                             synchronize)

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


def _probe_process(settings: dict, steps: int) -> None:
    torch.set_num_threads(1)
    _probe_train(settings, _device(settings), steps)


def concurrency_probe(settings: dict) -> dict:
    """Models·steps per second of the reference recipe's model trained W at a time: one after another in one
    process, W threads each on its own CUDA stream in one process, and W processes. Returns the rates and the
    fastest way (what trains the reference models)."""
    import multiprocessing as mp

    device = _device(settings)
    w, steps = settings["probe_models"], settings["probe_steps"]
    _probe_train(settings, device, 2)  # warm-up: kernels, cuDNN autotuning
    rates = {}
    t0 = time.perf_counter()
    for _ in range(w):
        _probe_train(settings, device, steps)
    rates["sequential"] = w * steps / (time.perf_counter() - t0)

    def one():
        with on_new_stream(device):
            _probe_train(settings, device, steps)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(w)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rates["streams" if is_cuda(device) else "threads"] = w * steps / (time.perf_counter() - t0)
    ctx = mp.get_context("spawn" if is_cuda(device) else "fork")  # fork: CPU only (the smoke run)
    procs = [ctx.Process(target=_probe_process, args=(settings, 2 + steps)) for _ in range(w)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if all(p.exitcode == 0 for p in procs):  # process start-up is part of the cost, as it is for real
        rates["processes"] = w * steps / (time.perf_counter() - t0)
    best = max(rates, key=rates.get)
    return {"rates": rates, "best": best, "models": w, "steps": steps}


def _begin_shadows(run_dir: Path, n_models: int, seed: int):
    """Write the reference models' keep masks and index as ``prepare_shadows`` does, so models trained here by
    several processes are the ones ``audit attack`` then verifies and re-uses."""
    from attacks.recipe import shadow_recipe
    from attacks.shadows import _new_index, balanced_keep_masks, shadow_seeds
    from foundation.files import INDEX_FILE, KEEP_FILE, SHADOW_DIR
    from foundation.io import sha256_file, write_json, write_npy
    from training.run import open_run

    target = open_run(run_dir)
    recipe = shadow_recipe(config=target.config, manifest=target.manifest)
    root = run_dir / SHADOW_DIR
    keep = balanced_keep_masks(n_models, len(target.pool), rng=[int(seed), 0x4B454550])
    path = write_npy(root / KEEP_FILE, keep)
    expected = {"recipe_hash": recipe.hash, "pool_fingerprint": target.pool_fingerprint, "n_reference": n_models,
                "seed": int(seed)}
    index = _new_index(expected, shadow_seeds(n_models, seed), sha256_file(path), recipe.to_dict(),
                       target.manifest.run_name)
    write_json(root / INDEX_FILE, index)
    return target, recipe, keep, index["seeds"], root


_WORKER: dict = {}


def _worker_init(run_dir: str, n_models: int, seed: int, device: str) -> None:
    from attacks.recipe import shadow_recipe
    from attacks.shadows import shadow_seeds
    from foundation.files import KEEP_FILE, SHADOW_DIR
    from training.run import open_run

    torch.set_num_threads(1)
    target = open_run(Path(run_dir))
    root = Path(run_dir) / SHADOW_DIR
    _WORKER.update(target=target, recipe=shadow_recipe(config=target.config, manifest=target.manifest), root=root,
                   keep=np.load(root / KEEP_FILE), seeds=shadow_seeds(n_models, seed), device=device)


def _train_models(todo: list[int]) -> list[int]:
    from attacks.shadow_train import train_shadow_models
    from training.device import resolve_device
    from training.run.verified import canary_package_of

    w = _WORKER
    t = w["target"]
    train_shadow_models(recipe=w["recipe"], pool=t.pool, test=t.population, keep=w["keep"], seeds=w["seeds"],
                        todo=todo, root=w["root"], target_name=t.manifest.run_name, executor="sequential",
                        device=resolve_device(w["device"]), trust_code=t.code.trust_code,
                        canary_package=canary_package_of(t))
    return todo


def _train_references(run_dir: Path, k: int, seed: int, how: str, workers: int, device: str) -> None:
    """Train the K reference models: ``processes`` (``workers`` processes), ``streams``/``threads`` (``workers``
    threads, each model on its own CUDA stream), else one after another (the attack's own sequential executor)."""
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
    import multiprocessing as mp

    _begin_shadows(run_dir, k, seed)
    if how == "processes":
        method = "spawn" if is_cuda(resolve_device(device)) else "fork"  # never fork a process holding CUDA
        with ProcessPoolExecutor(workers, mp_context=mp.get_context(method), initializer=_worker_init,
                                 initargs=(str(run_dir), k, seed, device)) as pool:
            list(pool.map(_train_models, [[i] for i in range(k)]))
        return
    _worker_init(str(run_dir), k, seed, device)
    if how in ("streams", "threads"):
        def one(i):
            with on_new_stream(resolve_device(device)):
                _train_models([i])
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, range(k)))
        return
    _train_models(list(range(k)))


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
    """Stage b: the concurrency probe, then K = 16 reference models trained the fastest way and the attacks
    (LiRA online/offline, RMIA; 18 queries), then K = 64 when the stage's deadline leaves room for it."""
    import shutil

    from audit import api
    from foundation.files import SHADOW_DIR

    t_stage = time.perf_counter()
    deadline = settings["deadline_at"]
    probe = concurrency_probe(settings)
    out = {"probe": probe, "runs": []}
    _write_partial(settings, out)
    run_dir = Path(settings["run_dir"])
    per_model = None
    for k in settings["n_reference"]:
        left = deadline - time.time()
        if per_model is not None and per_model * k * 1.15 > left:
            out["skipped"] = f"K = {k}: ~{per_model * k:.0f} s of training needed, {left:.0f} s left"
            break
        shutil.rmtree(run_dir / SHADOW_DIR, ignore_errors=True)
        device = _device(settings)
        how = settings.get("force_way", {}).get(str(k), probe["best"])
        t0 = time.perf_counter()
        try:
            _train_references(run_dir, k, settings["seed"], how, settings["probe_models"], settings["device"])
        except Exception as exc:  # noqa: BLE001 - the attack below trains whatever is missing, one after another
            out.setdefault("notes", []).append(f"K = {k}: training {how} failed ({type(exc).__name__}: "
                                               f"{' '.join(str(exc).split())[:200]}); the attack trained the rest")
            how += " (failed; rest sequential)"
        t_train = time.perf_counter() - t0
        per_model = t_train / k
        overrides = [f"attack.n_reference={k}", f"attack.attacks=[{', '.join(ATTACKS)}]", "attack.flip=true",
                     f"attack.shifts={settings['shifts']}", f"attack.n_bootstrap={settings['n_bootstrap']}",
                     f"attack.seed={settings['seed']}", f"attack.device={settings['device']}",
                     f"attack.population={settings['population']}",
                     f"attack.signal_batch_size={settings.get('signal_batch_size', 512)}"]
        t1 = time.perf_counter()
        report = api.attack(run_dir, overrides=overrides).report.model_dump()
        queries = len(report["setup"]["augmentations"])
        out["runs"].append({"k": k, "train_seconds": t_train, "attack_seconds": time.perf_counter() - t1,
                            "how": how, "queries": queries, "attacks": _attack_row(report),
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
