"""Input canaries for a training script we did not write: the user's dataset plus examples that are easy to memorise.

A one-run audit (Steinke, Nasr, Jagielski, NeurIPS 2023) needs m canaries, each included in training
independently with probability 1/2. :class:`CanaryDataset` wraps the user's ``torch.utils.data.Dataset``
(before it reaches a ``DataLoader`` and ``PrivacyEngine.make_private``): items ``0 .. n-1`` are the user's,
items ``n ..`` are the *included* canaries; the excluded ones are drawn and kept (they are the audit's
non-members) but never served. Kinds, as in ``training.canaries`` of ``audit train``:

* ``mislabel``: examples of a held-out ``source`` dataset (e.g. the test set) with a label drawn uniformly
  among the wrong classes;
* ``ood``: uniform-noise tensors shaped like the user's inputs, random labels.

Canary inputs are stored as the float tensors the model receives (the user's transforms already applied to
``source`` items), so the auditor can score them after training (:meth:`CanaryDataset.scores`: the scaled logit
φ = log p_y − log Σ_{y'≠y} p_y', higher = member).

>>> import torch
>>> data = torch.utils.data.TensorDataset(torch.zeros(10, 1, 4, 4), torch.zeros(10, dtype=torch.long))
>>> wrapped = CanaryDataset(data, count=6, kind="ood", num_classes=3, seed=0)
>>> len(wrapped) == 10 + int(wrapped.included.sum()), wrapped.canary_x.shape
(True, (6, 1, 4, 4))
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from audit.integrations.audit_pool import AuditPool
from foundation.io import fingerprint_arrays
from training.input_canaries import canary_rng, noise_tensors, pick_sources, wrong_labels
from training.pool import draw_membership

__all__ = ["CanaryDataset"]


class CanaryDataset(Dataset):
    """The user's dataset followed by the included input canaries.

    Args:
        dataset: the user's training set; item ``i`` is ``(x, y)`` with ``x`` a tensor.
        count: m ≥ 2 canaries (about half are included).
        kind: ``"mislabel"`` (needs ``source``) or ``"ood"``.
        num_classes: number of classes (labels are in ``[0, num_classes)``).
        source: held-out ``(x, y)`` dataset the mislabelled canaries are drawn from (do not evaluate on those
            items afterwards: :attr:`source_indices` lists them).
        seed: integer seed of the draw (which items, which labels, which canaries are included; over an
            :class:`~audit.integrations.audit_pool.AuditPool`, inclusion continues the pool's own draw instead).

    Raises:
        ValueError: a malformed argument (the message names it).
    """

    def __init__(self, dataset: Dataset, *, count: int, kind: Literal["mislabel", "ood"] = "mislabel",
                 num_classes: int, source: Dataset | None = None, seed: int = 0) -> None:
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 2:
            raise ValueError(f"count must be an integer >= 2, got {count!r}")
        if kind not in ("mislabel", "ood"):
            raise ValueError(f"kind must be 'mislabel' or 'ood', got {kind!r}")
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.dataset, self.count, self.kind = dataset, int(count), kind
        self.num_classes, self.seed = int(num_classes), int(seed)
        self.n_real = len(dataset)  # type: ignore[arg-type]
        if self.n_real == 0:
            raise ValueError("dataset is empty")
        x0, y0 = dataset[0]
        self._label_is_tensor = isinstance(y0, torch.Tensor)
        shape = tuple(torch.as_tensor(x0).shape)
        rng = canary_rng(self.seed)  # the generator of audit train's canaries: same seed, same draws
        self.source_indices: list[int] = []
        if kind == "mislabel":
            if source is None or len(source) < self.count:  # type: ignore[arg-type]
                have = 0 if source is None else len(source)  # type: ignore[arg-type]
                raise ValueError(f"kind='mislabel' needs a source dataset of at least count={self.count} held-out "
                                 f"items, got {have}; pass source= (e.g. the test set) or use kind='ood'")
            self.source_indices = pick_sources(rng, n_source=len(source), count=self.count).tolist()
            items = [source[i] for i in self.source_indices]
            x = torch.stack([torch.as_tensor(it[0], dtype=torch.float32) for it in items])
            true = np.array([int(it[1]) for it in items], dtype=np.int64)
            y = wrong_labels(rng, true, num_classes=self.num_classes)
        else:
            noise, y = noise_tensors(rng, count=self.count, shape=shape, num_classes=self.num_classes)
            x = torch.from_numpy(noise)
        if tuple(x.shape[1:]) != shape:
            raise ValueError(f"source items have shape {tuple(x.shape[1:])}, the dataset's have {shape}")
        self.canary_x = x.numpy().astype(np.float32)
        self.canary_y = np.asarray(y, dtype=np.int64)
        if isinstance(dataset, AuditPool):  # one Bernoulli(1/2) draw over pool and canaries from the pool's seed,
            n_pool = dataset.size           # as audit train draws a pool with its canaries (recorded as one scheme)
            self.included = draw_membership(n_pool + self.count, p=0.5, seed=dataset.seed)[n_pool:]
        else:
            self.included = draw_membership(self.count, p=0.5, seed=self.seed)
        self._served = np.flatnonzero(self.included)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input tensor."""
        return tuple(self.canary_x.shape[1:])

    def __len__(self) -> int:
        return self.n_real + int(self._served.size)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} items")
        if index < self.n_real:
            return self.dataset[index]
        j = int(self._served[index - self.n_real])
        y = int(self.canary_y[j])
        return torch.from_numpy(self.canary_x[j]), (torch.tensor(y) if self._label_is_tensor else y)

    def membership(self) -> np.ndarray:
        """One bool per pool index: the user's ``n`` items (all trained on), then every canary's inclusion."""
        return np.concatenate([np.ones(self.n_real, dtype=bool), self.included])

    def fingerprint(self) -> str:
        """sha256 over the pool size and the canaries' arrays (the user's data is not stored by the auditor)."""
        return fingerprint_arrays(np.array([self.n_real], dtype=np.int64), self.canary_x, self.canary_y)

    def record(self) -> dict[str, Any]:
        """The manifest's ``data.canaries`` description (without the file written by the auditor)."""
        source = ("held-out source items, relabelled to a wrong class" if self.kind == "mislabel"
                  else "uniform noise tensors")
        return {"kind": self.kind, "count": self.count, "seed": self.seed, "first_index": self.n_real,
                "source": source, "source_indices": list(self.source_indices),
                "inclusion": "bernoulli(1/2) via the membership mask"}

    @torch.no_grad()
    def scores(self, model: torch.nn.Module, *, device: torch.device | str | None = None,
               batch_size: int = 256) -> np.ndarray:
        """Scaled logit φ of every canary (included or not) under ``model`` (higher = member), float64 (m,)."""
        from attacks.signals import scaled_logit

        if device is None:
            device = next((p.device for p in model.parameters()), torch.device("cpu"))
        was_training = model.training
        model.eval()
        out = []
        try:
            for i in range(0, self.count, batch_size):
                xb = torch.from_numpy(self.canary_x[i:i + batch_size]).to(device)
                yb = torch.from_numpy(self.canary_y[i:i + batch_size]).to(device)
                out.append(scaled_logit(model(xb).float(), yb).double().cpu().numpy())
        finally:
            model.train(was_training)
        return np.concatenate(out)
