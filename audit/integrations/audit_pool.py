"""The members of a training script we did not write, drawn by the auditor: what LiRA and RMIA need.

Membership inference with reference models (LiRA, Carlini et al., S&P 2022; RMIA, Zarifzadeh et al., ICML 2024)
needs a *pool* whose examples were each trained on with probability 1/2, independently and recorded, and
reference models trained on other such halves of the same pool. A plain Opacus script trains on all of its data,
so no attack can be scored on it. :class:`AuditPool` wraps the user's dataset (before the ``DataLoader`` and
``PrivacyEngine.make_private``) and serves only a Bernoulli(1/2) half of it, drawn from ``seed``:
:attr:`AuditPool.membership` says which items the target trained on, :attr:`AuditPool.member_indices` lists
them (what ``train_fn(member_indices, seed)`` receives for a reference model, :func:`audit.attack`).

:class:`~audit.integrations.opacus.OpacusAuditor` finds an ``AuditPool`` behind its data loader (also inside a
:class:`~audit.integrations.canary_dataset.CanaryDataset`) and :meth:`~audit.integrations.opacus.OpacusAuditor.finish`
records the pool in the run directory: ``pool.npz`` (every item's input tensor and label, as the model receives
them), its fingerprint, the membership mask and its seed. ``audit.attack(run, train_fn=...)`` then scores the
target and the user-trained reference models on exactly those inputs.

>>> import torch
>>> data = torch.utils.data.TensorDataset(torch.arange(40.0).reshape(10, 1, 2, 2), torch.arange(10) % 2)
>>> pool = AuditPool(data, seed=0)
>>> len(pool) == int(pool.membership.sum()) == len(pool.member_indices), pool.membership.shape
(True, (10,))
>>> x, y = pool.arrays()
>>> x.shape, x.dtype, y.tolist() == [int(t) for _, t in data]
((10, 1, 2, 2), dtype('float32'), True)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from foundation.io import fingerprint_arrays
from training.pool import draw_membership

__all__ = ["AuditPool", "find_pool"]


class AuditPool(Dataset):
    """The user's dataset, of which only a Bernoulli(1/2) half (drawn from ``seed``) is served: the target's members.

    Args:
        dataset: the user's training set; item ``i`` is ``(x, y)`` with ``x`` a tensor (or array) and ``y`` an
            integer class label. Every item is part of the pool; about half are trained on.
        seed: integer seed of the membership draw (recorded in the manifest).
        queries: the same items as the model should be queried on, when ``dataset`` augments at random (e.g. the
            training set with the test transform): item ``i`` of both must be the same example. The pool records
            each item once, as ``queries`` (else ``dataset``) returns it; a dataset whose items change between two
            reads is refused when the pool is recorded, naming this argument.

    The recorded pool (``pool.npz``) holds every item as a float32 tensor: CIFAR-10's 50,000 training images take
    614 MB.

    Attributes:
        membership: bool ``(n,)``, True = served (the target trains on it).
        member_indices: int64 positions of the members in ``dataset`` (item ``i`` of the pool is
            ``dataset[member_indices[i]]``).

    Raises:
        ValueError: fewer than 2 items, a malformed seed, or ``queries`` of another length.
    """

    def __init__(self, dataset: Dataset, *, seed: int = 0, queries: Dataset | None = None) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        try:
            n = len(dataset)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"dataset must be a map-style torch Dataset with a length, got "
                            f"{type(dataset).__name__}") from None
        if n < 2:
            raise ValueError(f"dataset must hold at least 2 items to split into members and non-members, got {n}")
        if queries is not None and len(queries) != n:  # type: ignore[arg-type]
            raise ValueError(f"queries must hold the dataset's {n} items in the same order, got "
                             f"{len(queries)}")  # type: ignore[arg-type]
        self.dataset, self.seed, self.queries = dataset, int(seed), queries
        self.membership = draw_membership(n, p=0.5, seed=self.seed)
        self.member_indices = np.flatnonzero(self.membership).astype(np.int64)
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return int(self.member_indices.size)

    def __getitem__(self, index: int) -> Any:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} members")
        return self.dataset[int(self.member_indices[index])]

    @property
    def size(self) -> int:
        """Number of pool items (members and non-members)."""
        return int(self.membership.size)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every pool item as the model receives it: ``x`` float32 ``(n, ...)`` and ``y`` int64 ``(n,)`` (read
        once, then kept).

        Raises:
            ValueError: items of different shapes, or a label that is not one integer.
        """
        if self._arrays is None:
            source = self.check_stable()
            xs, ys = [], []
            for i in range(self.size):
                x, y = source[i]
                xs.append(torch.as_tensor(x, dtype=torch.float32).detach().cpu())
                label = torch.as_tensor(y)
                if label.numel() != 1 or label.is_floating_point():
                    raise ValueError(f"item {i} of the dataset has label {y!r}: the pool needs one integer class "
                                     f"label per item")
                ys.append(int(label))
            shapes = {tuple(t.shape) for t in xs}
            if len(shapes) != 1:
                raise ValueError(f"the dataset's inputs have different shapes {sorted(shapes)[:3]}: the pool needs "
                                 f"one input shape")
            self._arrays = (torch.stack(xs).numpy(), np.asarray(ys, dtype=np.int64))
        return self._arrays

    def check_stable(self) -> Dataset:
        """The dataset the pool is recorded from (``queries``, else ``dataset``), after checking that its item 0
        reads the same twice (:class:`~audit.integrations.opacus.OpacusAuditor` checks it before training).

        Raises:
            ValueError: the item differs between two reads (random augmentation), naming ``queries=``.
        """
        source = self.queries if self.queries is not None else self.dataset
        first, again = source[0][0], source[0][0]
        if not torch.equal(torch.as_tensor(first), torch.as_tensor(again)):
            raise ValueError("item 0 of the dataset differs between two reads (random augmentation?): the pool "
                             "records each item once, so pass the same items without it as "
                             "audit.AuditPool(..., queries=dataset_with_the_test_transform)")
        return source

    def fingerprint(self) -> str:
        """sha256 over the pool's inputs and labels (:func:`foundation.io.fingerprint_arrays`)."""
        return fingerprint_arrays(*self.arrays())

    def record(self) -> dict[str, Any]:
        """The manifest's description of the pool (without the file the auditor writes)."""
        return {"size": self.size, "n_members": len(self), "seed": self.seed,
                "inclusion": "bernoulli(1/2) per item, drawn by audit.AuditPool from seed"}

    def __repr__(self) -> str:
        return f"AuditPool(size={self.size}, members={len(self)}, seed={self.seed})"


def find_pool(dataset: Any) -> AuditPool | None:
    """The :class:`AuditPool` a data loader's dataset is (or wraps, inside a ``CanaryDataset``), or None."""
    if isinstance(dataset, AuditPool):
        return dataset
    inner = getattr(dataset, "dataset", None)
    return inner if isinstance(inner, AuditPool) else None
