"""`audit train`: one DP (or non-DP) training run that writes a run directory carrying its claim.

The loop is deliberately plain: a sampler yields the example indices of each logical step (Poisson by default,
deterministic per (seed, step)), the :class:`training.dp.engine.Stepper` does the clipped, noised update in
physical chunks, and every ``checkpoint_every`` steps the full state is written atomically so that ``--resume``
after any interrupt (kill -9 included) continues exactly where the last checkpoint left off: the final weights
equal an uninterrupted run's, and the accountant counts every step taken.
"""

from __future__ import annotations

import math
import platform
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training import __version__
from training.accounting import DPPhase, cross_check, default_delta, noise_multiplier_for
from training.checkpoint import clear_state, load_state, save_state
from training.config import TrainConfig, dump_config
from training.data import to_float_tensor
from training.dp.engine import make_stepper
from training.dp.sampling import PoissonSampler, ShuffleSampler
from training.errors import CheckpointError, UserError
from training.io import save_safetensors, sha256_bytes, sha256_file, write_json, write_npy, write_text
from training.manifest import (DataInfo, Manifest, MembershipInfo, ModelInfo, PhaseInfo, PrivacyInfo, Provenance,
                               read_manifest, write_manifest)
from training.models import build_model, count_parameters
from training.pool import Pool, build_pool, draw_membership
from training.progress import TrainLogger

class RdpCurve:
    """Epsilon spent after t steps for the TensorBoard curve: RDP composes linearly in t, so one RDP evaluation
    serves every step. (The claim itself uses the configured accountant, once, at the end.)"""

    ORDERS = tuple([1 + x / 4.0 for x in range(1, 40)] + list(range(11, 64)) + [128, 256])

    def __init__(self, *, noise_multiplier: float, sample_rate: float, delta: float) -> None:
        from opacus.accountants.analysis.rdp import compute_rdp

        self._delta = delta
        self._rdp1 = np.asarray(compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1,
                                            orders=list(self.ORDERS))) if noise_multiplier > 0 else None

    def __call__(self, steps: int) -> float:
        from opacus.accountants.analysis.rdp import get_privacy_spent

        if self._rdp1 is None:
            return float("inf")
        eps, _ = get_privacy_spent(orders=list(self.ORDERS), rdp=self._rdp1 * steps, delta=self._delta)
        return float(eps)


__all__ = ["TrainResult", "RdpCurve", "train", "resolve_device", "evaluate_accuracy", "step_seed"]


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    manifest: Manifest
    metrics: dict[str, Any]
    resumed_from: int = 0
    already_complete: bool = False


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("training.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def step_seed(seed: int, step: int, stream: int) -> int:
    """A 63-bit seed for (run seed, step, stream): per-step randomness that makes resume exact."""
    return int(np.random.SeedSequence([int(seed), int(step), int(stream)]).generate_state(2, np.uint32)
               .astype(np.uint64).dot([1 << 31, 1]))


@torch.no_grad()
def evaluate_accuracy(model: torch.nn.Module, x_u8: np.ndarray, y: np.ndarray, *, device: torch.device,
                      batch_size: int = 512) -> float:
    """Top-1 accuracy of ``model`` on uint8 NHWC images (nan for an empty set)."""
    if len(y) == 0:
        return float("nan")
    was_training = model.training
    model.eval()
    correct = 0
    for i in range(0, len(y), batch_size):
        xb = to_float_tensor(x_u8[i:i + batch_size]).to(device)
        correct += int((model(xb).argmax(1).cpu() == torch.from_numpy(np.array(y[i:i + batch_size]))).sum())
    model.train(was_training)
    return correct / len(y)


def _git_commit() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _versions() -> dict[str, str | None]:
    def ver(mod: str) -> str | None:
        try:
            return __import__(mod).__version__
        except Exception:
            return None

    return {"python": platform.python_version(), "torch": torch.__version__, "opacus": ver("opacus"),
            "timm": ver("timm")}


def _prepare_run_dir(run_dir: Path, config_sha: str, *, resume: bool, overwrite: bool) -> str:
    """Decide what to do with an existing run directory: 'fresh', 'resume' or 'complete'."""
    manifest = run_dir / "manifest.json"
    state = run_dir / "state"
    if overwrite and run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    if manifest.exists():
        cfg_file = run_dir / "config.yaml"
        if cfg_file.exists() and sha256_file(cfg_file) == config_sha:
            return "complete"
        raise CheckpointError(f"{run_dir} already holds a finished run with a different config; choose another "
                              f"name (--set name=...) or pass --overwrite")
    if state.exists():
        if not resume:
            raise CheckpointError(f"{run_dir} holds an interrupted run; pass --resume to continue it or "
                                  f"--overwrite to start again")
        return "resume"
    return "fresh"


def _membership(cfg: TrainConfig, pool: Pool) -> tuple[np.ndarray, MembershipInfo]:
    n = len(pool.images)
    if cfg.data.audit_split:
        mask = draw_membership(n, p=cfg.data.member_prob, seed=cfg.data.membership_seed)
        info = MembershipInfo(scheme="bernoulli", p=cfg.data.member_prob, seed=cfg.data.membership_seed,
                              n_members=int(mask.sum()), n_pool=n)
    else:
        mask = np.ones(n, dtype=bool)
        if pool.n_canaries:  # canaries are always included with probability 1/2, real data is all IN
            mask[pool.n_real:] = draw_membership(pool.n_canaries, p=0.5, seed=cfg.data.membership_seed)
        info = MembershipInfo(scheme="all", p=None, seed=cfg.data.membership_seed, n_members=int(mask.sum()),
                              n_pool=n)
    return mask, info


def train(cfg: TrainConfig, *, run_dir: str | Path | None = None, resume: bool = False, overwrite: bool = False,
          membership: np.ndarray | None = None, progress: bool | None = None, command: str | None = None,
          stop_after: int | None = None, _debug_disable_noise: bool = False) -> TrainResult:
    """Train one model as ``cfg`` says and write its run directory.

    Args:
        cfg: the validated config.
        run_dir: where to write (default ``cfg.output_dir/cfg.name``).
        resume: continue an interrupted run from its last saved state.
        overwrite: delete an existing run directory first.
        membership: explicit bool mask over the pool (reference models); default from ``cfg.data``.
        progress: show a progress bar (default ``cfg.training.progress``).
        command: the command line, recorded in the provenance.
        stop_after: stop (with state saved) after this many steps: simulates an interrupt in tests.
        _debug_disable_noise: TEST ONLY. Skips the DP noise while the manifest still claims DP: a planted bug
            that the white-box audit must catch.

    Returns:
        TrainResult with the run directory, its manifest and metrics.

    Raises:
        UserError: bad config values, missing data, batch larger than the dataset, mismatched resume state.
    """
    run_dir = Path(run_dir) if run_dir is not None else cfg.run_dir()
    config_text = dump_config(cfg)
    config_sha = sha256_bytes(config_text.encode("utf-8"))
    mode = _prepare_run_dir(run_dir, config_sha, resume=resume, overwrite=overwrite)
    if mode == "complete" and membership is None:
        from training.checkpoint import read_metrics

        return TrainResult(run_dir, read_manifest(run_dir), read_metrics(run_dir), already_complete=True)
    if mode == "complete":
        from training.checkpoint import read_metrics

        stored = np.load(run_dir / "membership.npy", allow_pickle=False)
        if stored.shape == membership.shape and bool((stored == membership).all()):
            return TrainResult(run_dir, read_manifest(run_dir), read_metrics(run_dir), already_complete=True)
        raise CheckpointError(f"{run_dir} holds a finished run with another membership mask; pass --overwrite")

    tc = cfg.training
    pool = build_pool(cfg)
    if membership is not None:
        mask = np.asarray(membership, dtype=bool)
        if mask.shape != (len(pool.images),):
            raise UserError(f"membership mask has shape {mask.shape}, the pool has {len(pool.images)} examples")
        mem_info = MembershipInfo(scheme="explicit", n_members=int(mask.sum()), n_pool=len(mask))
    else:
        mask, mem_info = _membership(cfg, pool)
    members = np.flatnonzero(mask)
    n = len(members)
    if n == 0:
        raise UserError("the membership draw selected no training examples; enlarge the pool")
    batch = tc.batch_size
    if batch > n:
        raise UserError(f"training.batch_size={batch} is larger than the {n} training examples; "
                        f"lower it or enlarge the pool (data.pool_size / data.audit_split)")
    steps = tc.steps if tc.steps is not None else max(1, math.ceil(tc.epochs * n / batch))
    sample_rate = batch / n

    pc = cfg.privacy
    delta = pc.delta if pc.delta is not None else default_delta(n)
    notes: list[str] = []
    if pc.enabled and delta >= 1.0 / n:
        notes.append(f"delta={delta:g} is not below 1/n={1.0 / n:.3g}: the guarantee is weak")
        print(f"warning: privacy.delta={delta:g} >= 1/n = {1.0 / n:.3g}; use a smaller delta", file=sys.stderr)
    if pc.enabled and pc.sampling != "poisson":
        notes.append("batches were formed by shuffling, not Poisson sampling; the epsilon below is computed as if "
                     "sampling were Poisson and is NOT a proven guarantee for this run")
    sigma = 0.0
    if pc.enabled:
        sigma = (pc.noise_multiplier if pc.noise_multiplier is not None else noise_multiplier_for(
            target_epsilon=pc.target_epsilon, sample_rate=sample_rate, steps=steps, delta=delta,
            accountant=pc.accountant))

    device = resolve_device(tc.device)
    input_shape = (3, *pool.images.x.shape[1:3])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tc.seed)
        built = build_model(cfg.model, num_classes=len(pool.images.classes), input_shape=input_shape)
    model = built.module.to(device)
    if mode == "fresh":
        run_dir.mkdir(parents=True, exist_ok=True)
        save_safetensors(run_dir / "model_init.safetensors", model.state_dict())
        write_text(run_dir / "config.yaml", config_text)

    generator = torch.Generator(device=device)
    canaries = _gradient_canaries(cfg, model)
    stepper = make_stepper(
        model=model, privacy=pc, optim=cfg.optim, sample_rate=sample_rate, expected_batch_size=batch,
        total_steps=steps, noise_multiplier=sigma, physical_batch_size=tc.physical_batch_size,
        generator=generator, device=device, gradient_canaries=canaries,
        _debug_disable_noise=_debug_disable_noise)
    sampler = (PoissonSampler(n, sample_rate, tc.seed) if pc.sampling == "poisson"
               else ShuffleSampler(n, batch, tc.seed))

    start, history = 0, []
    if mode == "resume":
        state = load_state(run_dir, config_sha256=config_sha)
        if state is not None:
            stepper.base_model.load_state_dict(state["model"])
            stepper.load_state_dict(state["stepper"])
            start, history = int(state["step"]), list(state["history"])

    x_pool, y_pool = pool.images.x, pool.images.y
    spent = RdpCurve(noise_multiplier=sigma, sample_rate=sample_rate, delta=delta) if pc.enabled else None
    logger = TrainLogger(run_dir / "tb", total=steps, start=start,
                         show=tc.progress if progress is None else progress, dp=pc.enabled)
    t0 = time.perf_counter()
    try:
        for step in range(start, steps):
            idx = members[sampler.indices(step)]
            generator.manual_seed(step_seed(tc.seed, step, 1))
            xb = to_float_tensor(x_pool[idx]).to(device)
            yb = torch.as_tensor(y_pool[idx], dtype=torch.long, device=device)
            stats = stepper.step(xb, yb)
            done = step + 1
            eps_now = None
            if pc.enabled and (done % tc.log_every == 0 or done == steps):
                eps_now = spent(done)
            row = logger.log(done, stats, epsilon=eps_now)
            if done % tc.log_every == 0 or done == steps:
                history.append(row)
            if tc.eval_every and done % tc.eval_every == 0 and pool.test is not None:
                logger.scalar("test/accuracy", evaluate_accuracy(stepper.base_model, pool.test.x, pool.test.y,
                                                                 device=device), done)
            if done % tc.checkpoint_every == 0 or done == steps or done == stop_after:
                save_state(run_dir, {"step": done, "config_sha256": config_sha, "stepper": stepper.state_dict(),
                                     "model": {k: v.detach().cpu() for k, v in
                                               stepper.base_model.state_dict().items()},
                                     "history": history})
            if stop_after is not None and done >= stop_after and done < steps:
                logger.close()
                raise KeyboardInterrupt
    finally:
        logger.close()
    wall = time.perf_counter() - t0

    final = stepper.base_model
    test_acc = (evaluate_accuracy(final, pool.test.x, pool.test.y, device=device)
                if pool.test is not None else None)
    train_acc = evaluate_accuracy(final, x_pool[members], y_pool[members], device=device)
    phase = PhaseInfo(
        name="private" if pc.enabled else "non-private", dp=pc.enabled, dataset=cfg.data.dataset,
        noise_multiplier=sigma if pc.enabled else None, sample_rate=sample_rate, steps=steps, batch_size=batch,
        sampling=pc.sampling, max_grad_norm=pc.max_grad_norm if pc.enabled else None,
        clipping=pc.clipping if pc.enabled else None, grad_sample_mode=pc.grad_sample_mode if pc.enabled else None,
        optimizer=cfg.optim.name, lr=cfg.optim.lr, frozen=list(built.frozen))
    privacy = _privacy_info(pc, [phase], delta, notes)
    if privacy.epsilon is not None:
        phase = phase.model_copy(update={"epsilon": privacy.epsilon})
        privacy = privacy.model_copy(update={"phases": [phase]})
    metrics = {"test_accuracy": test_acc, "train_accuracy": train_acc, "steps": steps,
               "epsilon_spent": privacy.epsilon, "final_loss": history[-1]["loss"] if history else None,
               "wall_seconds": wall, "history": history}
    extra = {}
    if canaries is not None:
        inc = write_npy(run_dir / "gradient_canaries.npy", canaries.included)
        extra["gradient_canaries"] = {
            "count": canaries.count, "seed": canaries.seed, "included_file": inc.name,
            "included_sha256": sha256_file(inc), "n_included": int(canaries.included.sum()),
            "sample_rate": sample_rate, "steps": steps, "scale": "max_grad_norm (C * u_i added to the clipped sum)",
            "param_names": list(canaries.param_shapes), "init_weights": "model_init.safetensors",
            "init_weights_sha256": sha256_file(run_dir / "model_init.safetensors")}
    manifest = _finalize(run_dir, cfg, built, pool, mask, mem_info, privacy, metrics, config_sha, command, device,
                         extra)
    return TrainResult(run_dir, manifest, metrics, resumed_from=start)


def _gradient_canaries(cfg: TrainConfig, model: torch.nn.Module):
    gc = cfg.training.gradient_canaries
    if gc.count == 0:
        return None
    if not cfg.privacy.enabled:
        raise UserError("training.gradient_canaries need privacy.enabled: true (they audit the DP-SGD step)")
    from training.dp.canaries import GradientCanaries

    included = draw_membership(gc.count, p=0.5, seed=gc.seed)
    return GradientCanaries.for_model(model, count=gc.count, seed=gc.seed, included=included)


def _privacy_info(pc, phases: list[PhaseInfo], delta: float, notes: list[str]) -> PrivacyInfo:
    dp_phases = [DPPhase(p.noise_multiplier, p.sample_rate, p.steps) for p in phases if p.dp]
    if not dp_phases:
        return PrivacyInfo(dp=False, delta=None, accountant=None, epsilon=None, phases=phases,
                           notes=notes + ["no DP phase: this checkpoint makes no privacy claim (epsilon = inf)"])
    check = cross_check(phases=dp_phases, delta=delta, accountant=pc.accountant)
    return PrivacyInfo(dp=True, delta=delta, accountant=pc.accountant, epsilon=check["epsilon"],
                       epsilon_cross_check={"accountant": "pld (dp-accounting)", "epsilon": check["epsilon_pld"],
                                            "relative_difference": check["relative_difference"]},
                       phases=phases, notes=notes)


def _finalize(run_dir: Path, cfg: TrainConfig, built, pool: Pool, mask: np.ndarray, mem_info: MembershipInfo,
              privacy: PrivacyInfo, metrics: dict, config_sha: str, command: str | None,
              device: torch.device, extra: dict | None = None) -> Manifest:
    """Write weights, membership, metrics and the manifest (last: its presence marks the run complete)."""
    model = built.module
    weights = save_safetensors(run_dir / "model.safetensors", model.state_dict())
    mem_path = write_npy(run_dir / "membership.npy", mask)
    write_json(run_dir / "metrics.json", metrics)
    total, trainable = count_parameters(model)
    m = cfg.model
    manifest = Manifest(
        run_name=cfg.name,
        model=ModelInfo(arch=m.arch, kwargs=dict(m.kwargs), num_classes=len(pool.images.classes),
                        input_shape=(3, *pool.images.x.shape[1:3]), normalize_mean=m.normalize_mean,
                        normalize_std=m.normalize_std, cifar_stem=m.cifar_stem, fix_batchnorm=m.fix_batchnorm,
                        param_count=total, trainable_param_count=trainable, weights_sha256=sha256_file(weights),
                        frozen=list(built.frozen), notes=list(built.notes)),
        data=DataInfo(dataset=cfg.data.dataset, root=cfg.data.root, split=cfg.data.split,
                      test_split=cfg.data.test_split, image_size=cfg.data.image_size, pool_size=len(mask),
                      pool_seed=cfg.data.pool_seed, pool_subset=cfg.data.pool_size is not None,
                      pool_fingerprint=pool.images.fingerprint(), membership_sha256=sha256_file(mem_path),
                      membership=mem_info, canaries=pool.canaries),
        privacy=privacy,
        training={"recipe": cfg.training.recipe, "optimizer": cfg.optim.model_dump(mode="json"),
                  "steps": metrics["steps"], "batch_size": cfg.training.batch_size,
                  "test_accuracy": metrics["test_accuracy"], "train_accuracy": metrics["train_accuracy"],
                  **(extra or {})},
        provenance=Provenance(package_version=__version__, git_commit=_git_commit(), **_versions(),
                              seed=cfg.training.seed, config_sha256=config_sha,
                              created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              command=command, device=str(device)),
    )
    write_manifest(run_dir, manifest)
    clear_state(run_dir)
    return manifest
