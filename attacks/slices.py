"""Where an attack bites: per-class slices of its AUC and the members it exposes most.

Pure functions over arrays, "higher score = member" as everywhere in :mod:`attacks`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attacks.metrics import _check, auc

__all__ = ["per_class_metrics", "most_vulnerable"]


def per_class_metrics(scores: Any, labels_member: Any, class_labels: Any) -> dict[Any, dict[str, Any]]:
    """AUC per class slice: ``{class: {"auc": float | None, "n": ., "n_members": ., "n_nonmembers": .}}``.

    ``auc`` is None for a class that lacks members or non-members.

    >>> per_class_metrics([3, 1, 2, 0], [1, 0, 1, 0], [0, 0, 1, 1])[1]
    {'auc': 1.0, 'n': 2, 'n_members': 1, 'n_nonmembers': 1}
    """
    s, y = _check(scores, labels_member, need_both=False)
    c = np.asarray(class_labels)
    if c.shape != s.shape:
        raise ValueError(f"class_labels must have the shape of scores {s.shape}; got {c.shape}")
    out: dict[Any, dict[str, Any]] = {}
    for cls in np.unique(c):
        sel = c == cls
        n_mem, n_non = int(y[sel].sum()), int((~y[sel]).sum())
        out[cls.item()] = {"auc": auc(s[sel], y[sel]) if n_mem and n_non else None,
                           "n": int(sel.sum()), "n_members": n_mem, "n_nonmembers": n_non}
    return out


def most_vulnerable(scores: Any, labels_member: Any, k: int, pool_indices: Any = None) -> list[int]:
    """The ``k`` true members with the highest scores, most exposed first (ties: lower position first).

    Args:
        scores: ``(n,)`` scores, higher = member.
        labels_member: ``(n,)`` true membership.
        k: how many (fewer are returned when there are fewer members).
        pool_indices: optional ``(n,)`` ids to return instead of positions (e.g. indices into the pool).

    >>> most_vulnerable([0.9, 0.95, 0.2, 0.7], [0, 1, 1, 1], 2, pool_indices=[10, 11, 12, 13])
    [11, 13]
    """
    s, y = _check(scores, labels_member, need_both=False)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be an integer >= 0; got {k!r}")
    ids = np.arange(s.size) if pool_indices is None else np.asarray(pool_indices)
    if ids.shape != s.shape:
        raise ValueError(f"pool_indices must have the shape of scores {s.shape}; got {ids.shape}")
    members = np.flatnonzero(y)
    top = members[np.argsort(-s[members], kind="stable")[:k]]
    return [int(i) for i in ids[top]]
