"""The command that (re)produces each file of a run directory, as the report names it; for a step that cannot run
on the run, why, so that no hint in a report leads to a command that would refuse the run (issue 34).

A run of the user's own model class (``OpacusAuditor``: ``model.arch`` ``user-model/...``) cannot be rebuilt by
auditors: ``audit attack``/``audit transfer`` refuse it. When it recorded its pool (``audit.AuditPool``), it is
attacked from Python with the user's training function, ``audit.attack(RUN, train_fn=...)``; a run that recorded
none is never pointed there.

>>> from pathlib import Path
>>> from types import SimpleNamespace as NS
>>> run = NS(run_dir=Path("r"), manifest=NS(model=NS(arch="user-model/my.Net"), training={"audit_pool": {}},
...                                        provenance=NS(config_file=None)))
>>> commands_for(run)["attack"][:60]
'run from Python with the function that trained the model: au'
>>> commands_for(NS(run_dir=Path("r"), manifest=NS(model=NS(arch="user-model/my.Net"), training={},
...                                                provenance=NS(config_file=None))))["attack"] == USER_MODEL_NOTE
True
"""

from __future__ import annotations

import shlex
from typing import Any

from foundation.files import CONFIG_FILE, has_recorded_pool

__all__ = ["USER_MODEL_NOTE", "USER_TRAIN_NOTE", "rebuildable", "train_fn_hint", "commands_for"]

#: In place of a command for a run whose model auditors cannot rebuild (the user's own class, OpacusAuditor).
USER_MODEL_NOTE = ("not available for this run: its model is your own class (recorded by OpacusAuditor), which "
                   "auditors do not rebuild; the gradient and input canaries (audit epsilon) audit it")


#: Where the metrics of a run of the user's own model class come from (it has no config for audit train).
USER_TRAIN_NOTE = "your own training script (OpacusAuditor.finish)"


def rebuildable(run: Any) -> bool:
    """Whether auditors can rebuild the run's model (``audit attack``/``audit transfer`` need it): not for a
    model recorded as the user's own class (``model.arch`` ``user-model/...``)."""
    return not str(run.manifest.model.arch).startswith("user-model/")


def train_fn_hint(run: Any) -> str:
    """How a run of the user's own model class that recorded an ``audit.AuditPool`` is attacked: from Python,
    with the user's training function (:func:`audit.attack` with ``train_fn``)."""
    return (f"run from Python with the function that trained the model: "
            f"audit.attack({str(run.run_dir)!r}, train_fn=train_fn), where train_fn(member_indices, seed) trains "
            f"one reference model and returns it")


def commands_for(run: Any) -> dict[str, str]:
    """The exact command that (re)produces each file of the run directory; for a step that cannot run on it, why
    (:data:`USER_MODEL_NOTE`), so no hint leads to a command that would refuse the run. A run of the user's own
    model class that recorded its pool (``audit.AuditPool``) is attacked with the user's training function
    (:func:`train_fn_hint`); no hint names it for a run that recorded none."""
    run_q = shlex.quote(str(run.run_dir))
    cfg = run.run_dir / (run.manifest.provenance.config_file or CONFIG_FILE)
    model_steps = rebuildable(run)
    attack = (f"audit attack {run_q}" if model_steps
              else train_fn_hint(run) if has_recorded_pool(run.manifest) else USER_MODEL_NOTE)
    return {
        "train": f"audit train {shlex.quote(str(cfg))}" if model_steps else USER_TRAIN_NOTE,
        "attack": attack,
        "epsilon": f"audit epsilon {run_q}",
        "transfer": f"audit transfer {run_q}" if model_steps else USER_MODEL_NOTE,
        "report": f"audit report {run_q}",
    }
