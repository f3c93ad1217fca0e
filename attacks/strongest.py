"""The one definition of "the strongest attack", used by `audit run`'s summary, the report and `audit gate`
(a policy rule's ``attack: strongest``, alias ``max``: :mod:`audit.gate_rules`).

**Definition.** The reference FPR is the lowest FPR level that every attack's non-members resolve (at least
``1 / N``; :mod:`attacks.resolution`), no lower than 0.1 %. The strongest attack has the highest TPR at the
reference FPR; ties, and attacks with no TPR there, are broken by AUC (then by name, so the choice is
deterministic). Low-FPR TPR is what LiRA and RMIA are judged by (Carlini et al. 2022): an attack that finds a
few members with near certainty leaks more than one that is slightly better than chance everywhere.

>>> m = {"loss": (0.70, {"0.01": 0.02, "0.001": 0.004}, 2000), "lira": (0.65, {"0.01": 0.08, "0.001": 0.03}, 2000)}
>>> reference_level(m)
'0.001'
>>> strongest(m)          # the higher TPR at 0.1 % FPR wins over the higher AUC
'lira'
>>> few = {k: (auc, tpr, 690) for k, (auc, tpr, _n) in m.items()}   # 0.1 % is below 1/690: 1 % decides
>>> reference_level(few), strongest(few)
('0.01', 'lira')
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from attacks.resolution import resolvable

__all__ = ["REFERENCE_FPR", "DEFINITION", "reference_level", "strongest"]

#: The lowest FPR the definition asks for (0.1 %), when the non-members resolve it.
REFERENCE_FPR = 0.001

#: The definition in one sentence, for reports and tables.
DEFINITION = ("strongest attack = highest TPR at the lowest FPR every attack resolves (at least 0.1 %), "
              "ties broken by AUC")

#: name -> (AUC, TPR per FPR level keyed as in attack.json, number of non-members or None when unknown)
Candidates = Mapping[str, tuple[float, Mapping[str, float | str | None], int | None]]


def _num(value: float | str | None) -> float:
    if value is None or isinstance(value, str):
        return -1.0
    value = float(value)
    return -1.0 if math.isnan(value) else value


def reference_level(candidates: Candidates) -> str | None:
    """The FPR level (a key of the TPR maps) the comparison is made at, or None when there is none."""
    levels: dict[float, str] = {}
    for _auc, tprs, _n in candidates.values():
        for key in tprs:
            try:
                levels.setdefault(float(key), key)
            except ValueError:
                continue
    ns = [n for _auc, _tprs, n in candidates.values() if n is not None]
    usable = [lv for lv in sorted(levels) if lv >= REFERENCE_FPR - 1e-15 and all(resolvable(lv, n) for n in ns)]
    return levels[usable[0]] if usable else None


def strongest(candidates: Candidates, level: str | None = None) -> str | None:
    """The strongest attack's name (see the module's definition); ``level`` overrides the reference FPR."""
    if not candidates:
        return None
    level = reference_level(candidates) if level is None else level

    def key(name: str) -> tuple[float, float, str]:
        auc, tprs, _n = candidates[name]
        tpr = _num(tprs.get(level)) if level is not None else -1.0
        return (tpr, _num(auc), name)

    return max(candidates, key=key)
