"""A plain Opacus CIFAR-10 training script, plus the dp-audit lines (marked ``# audit:``) that audit it white-box.

The script is the kind users write: a small GroupNorm CNN, ``PrivacyEngine.make_private_with_epsilon`` with
Poisson sampling, ``BatchMemoryManager`` for the physical batches, SGD. The audit lines attach
:class:`audit.OpacusAuditor` right after ``make_private`` (m gradient canaries join the clipped sum, each included
with probability 1/2) and write the run directory at the end; then::

    audit epsilon results/opacus-cifar10     # empirical ε lower bounds and the verdict on the claim
    audit report results/opacus-cifar10      # report.html

Data: ``--data DIR`` holding ``train.npz`` and ``test.npz`` (``x`` uint8 N×32×32×3, ``y`` int64), e.g.
``../shared/data/cifar10``. Nothing is downloaded. A small run (5,000 training images, 3 epochs) takes a few
minutes on a laptop CPU::

    .venv/bin/python examples/opacus_cifar10.py --data ../shared/data/cifar10 --epsilon 8

``--gradient-canaries 0`` runs the same script without the auditor (for comparison). ``--attack K`` trains on an
``audit.AuditPool`` (a recorded Bernoulli(1/2) half of the training images) and then attacks the model with LiRA
and RMIA, K reference models trained by this script's own :func:`fit` (``audit.attack(run, train_fn=...)``)::

    .venv/bin/python examples/opacus_cifar10.py --data ../shared/data/cifar10 --epsilon 8 --attack 8
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def load_split(root: Path, split: str, limit: int, seed: int) -> torch.utils.data.TensorDataset:
    """``limit`` images of ``root/<split>.npz`` (a seeded subset), normalised, as float NCHW tensors."""
    path = Path(root) / f"{split}.npz"
    if not path.is_file():
        raise SystemExit(f"error: {path} not found: --data must be a directory with train.npz and test.npz "
                         "(x uint8 NxHxWx3, y int64)")
    with np.load(path, allow_pickle=False) as z:
        x, y = z["x"], z["y"]
    idx = np.sort(np.random.default_rng(seed).choice(len(x), size=min(limit, len(x)), replace=False))
    xt = torch.from_numpy(x[idx]).permute(0, 3, 1, 2).float() / 255.0
    xt = (xt - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    return torch.utils.data.TensorDataset(xt, torch.from_numpy(y[idx]).long())


class Net(nn.Module):
    """Three conv blocks with GroupNorm (Opacus cannot train BatchNorm) and a linear head."""

    def __init__(self, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.ReLU(), nn.MaxPool2d(2))

        self.features = nn.Sequential(block(3, width), block(width, width), block(width, 2 * width))
        self.head = nn.Linear(2 * width * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


@torch.no_grad()
def accuracy(model: nn.Module, data: torch.utils.data.TensorDataset) -> float:
    model.eval()
    x, y = data.tensors
    correct = sum(int((model(x[i:i + 500]).argmax(1) == y[i:i + 500]).sum()) for i in range(0, len(y), 500))
    model.train()
    return correct / len(y)


def fit(data, args: argparse.Namespace, *, seed: int, test=None, run_dir: Path | None = None):
    """This script's training: the target (``run_dir``: the auditor attached, the run directory written; returns
    ``(AuditedRun or None, results)``) or one reference model for ``audit.attack``'s ``train_fn`` (returns it)."""
    from opacus import PrivacyEngine
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    import audit  # audit: the one import

    torch.manual_seed(seed)
    model = Net(width=args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.0)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size)
    engine = PrivacyEngine(accountant="prv")
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model, optimizer=optimizer, data_loader=loader, epochs=args.epochs, target_epsilon=args.epsilon,
        target_delta=args.delta, max_grad_norm=args.max_grad_norm,
        noise_generator=torch.Generator().manual_seed(seed))
    auditor = None
    if run_dir is not None and args.gradient_canaries:  # audit: attach right after make_private
        auditor = audit.OpacusAuditor(optimizer, engine, loader, run_dir=run_dir, seed=seed,
                                      gradient_canaries=args.gradient_canaries, delta=args.delta)

    steps, t0 = 0, time.perf_counter()
    for epoch in range(args.epochs):
        with BatchMemoryManager(data_loader=loader, max_physical_batch_size=args.physical_batch_size,
                                optimizer=optimizer) as batches:
            for x, y in batches:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                steps += not optimizer._is_last_step_skipped
        if run_dir is not None:
            print(f"epoch {epoch + 1}: ε = {engine.get_epsilon(args.delta):.2f}, test accuracy "
                  f"{accuracy(model, test):.4f}", flush=True)
    if run_dir is None:
        return model  # a reference model for audit.attack's train_fn
    seconds = time.perf_counter() - t0
    acc = accuracy(model, test)
    out = {"test_accuracy": acc, "steps": steps, "seconds_per_step": seconds / max(steps, 1),
           "epsilon": float(engine.get_epsilon(args.delta)), "sigma": float(optimizer.noise_multiplier),
           "sample_rate": 1 / len(loader), "run_dir": None, "canary_seconds_per_step": 0.0}
    run = None
    if auditor is not None:  # audit: write the run directory (claim, weights, canary record)
        run = auditor.finish(model, test_accuracy=acc, metrics={"seconds_per_step": out["seconds_per_step"]})
        out.update(run_dir=str(run.run_dir), canary_seconds_per_step=auditor.canary_seconds / max(steps, 1))
    return run, out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="directory with train.npz and test.npz")
    p.add_argument("--epsilon", type=float, default=8.0)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--n-train", type=int, default=5000)
    p.add_argument("--n-test", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--physical-batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2.0)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--gradient-canaries", type=int, default=1000, help="0: run without the auditor")
    p.add_argument("--attack", type=int, default=0, metavar="K", help="train on an audit.AuditPool, then LiRA/RMIA "
                   "with K reference models trained by this script (even, >= 2; 0: no attack)")
    p.add_argument("--run-dir", type=Path, default=Path("results/opacus-cifar10"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.attack and (args.attack < 2 or args.attack % 2 or not args.gradient_canaries):
        raise SystemExit("error: --attack K needs an even K >= 2 and the auditor (--gradient-canaries > 0)")

    import audit  # audit: the one import

    warnings.filterwarnings("ignore", message=".*(Secure RNG|Full backward hook|Optimal order).*")
    train = load_split(args.data, "train", args.n_train, args.seed)
    test = load_split(args.data, "test", args.n_test, args.seed)
    data = audit.AuditPool(train, seed=args.seed) if args.attack else train  # audit: members drawn and recorded
    run, out = fit(data, args, seed=args.seed, test=test, run_dir=args.run_dir)
    if run is not None:
        print(f"wrote {run.run_dir}: now run 'audit epsilon {run.run_dir}' and 'audit report {run.run_dir}'")
    if args.attack:  # audit: LiRA and RMIA, the reference models trained by fit() itself
        result = audit.attack(run.run_dir, overrides={"attack.n_reference": args.attack}, progress=True,
                              train_fn=lambda members, seed: fit(torch.utils.data.Subset(train, members), args,
                                                                 seed=seed))
        out["attack_auc"] = {r["attack"]: r["auc"] for r in result.rows()}
        print("attack AUC: " + ", ".join(f"{name} {auc:.3f}" for name, auc in out["attack_auc"].items()))
    print(f"done: {out['steps']} steps, {out['seconds_per_step']:.3f} s/step, test accuracy "
          f"{out['test_accuracy']:.4f}, ε = {out['epsilon']:.2f} (δ = {args.delta:g}, σ = {out['sigma']:.3f}, "
          f"q = {out['sample_rate']:.4f})")
    return out


if __name__ == "__main__":
    main()
