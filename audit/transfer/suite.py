"""Transfer suites: which downstream datasets to evaluate a checkpoint on, and how.

A suite is a strict, frozen pydantic model serialised as YAML (``eval_configs/transfer/*.yaml``); unknown or
misspelt keys are errors naming the key. Dataset roots are paths on the user's disk: relative roots are
resolved against the current working directory (run ``audit transfer`` from the repository root for the
bundled suites), and users point them at their own copies of the data.

>>> suite = TransferSuite.model_validate({"name": "demo", "datasets": [{"name": "digits"}]})
>>> suite.datasets[0].key, suite.protocols.knn.k, suite.protocols.finetune.enabled
('digits', 20, False)
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from audit.transfer.probes import DEFAULT_C_GRID
from training.config import MAX_IMAGE_SIZE, Overrides, Strict, apply_overrides, load_yaml
from foundation.errors import ConfigError

__all__ = [
    "TransferDataset",
    "LinearProbeProtocol",
    "KnnProtocol",
    "FinetuneProtocol",
    "DiagnosticsProtocol",
    "Protocols",
    "Budget",
    "TransferSuite",
    "load_suite",
    "parse_suite",
]


class TransferDataset(Strict):
    """One downstream dataset: a ``training.data`` registry name, where its files are, which splits."""

    name: str = Field(description="registry name (cifar10, cifar100, svhn, food101, places365, inat2021, npz, ...)")
    label: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$",
                              description="name in the results (default: the registry name); must be unique")
    root: str | None = Field(None, description="data root on local disk (relative: to the working directory)")
    train_split: str = "train"
    test_split: str = "test"
    train_limit: int | None = Field(None, gt=0, description="cap on training examples (class-balanced)")
    test_limit: int | None = Field(None, gt=0, description="cap on test examples (class-balanced)")

    @model_validator(mode="after")
    def _check(self) -> TransferDataset:
        from training.data import DATASETS

        spec = DATASETS[self.name]  # unknown name: DataError listing the registered ones
        for split in (self.train_split, self.test_split):
            spec.resolve_split(split)  # unknown split: DataError listing the valid ones
        return self

    @property
    def key(self) -> str:
        """The label this dataset's results are reported under."""
        return self.label or self.name


class LinearProbeProtocol(Strict):
    """Multinomial logistic regression on frozen features (:func:`audit.transfer.probes.linear_probe`)."""

    enabled: bool = True
    c_grid: tuple[float, ...] = Field(DEFAULT_C_GRID, min_length=1)
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    max_iter: int = Field(1000, gt=0)

    @model_validator(mode="after")
    def _check(self) -> LinearProbeProtocol:
        if any(not c > 0 for c in self.c_grid):
            raise ValueError(f"c_grid must hold positive numbers, got {list(self.c_grid)}")
        return self


class KnnProtocol(Strict):
    """Cosine k-NN with ``exp(s / tau)`` votes (:func:`audit.transfer.knn.knn_classify`)."""

    enabled: bool = True
    k: int = Field(20, gt=0)
    temperature: float = Field(0.07, gt=0.0)


class FinetuneProtocol(Strict):
    """Full fine-tuning (new head + backbone) on the downstream training split, non-DP or DP at ``epsilon``."""

    enabled: bool = False
    dp: bool = False
    epsilon: float | None = Field(None, gt=0.0, description="target epsilon of the DP fine-tune (sigma calibrated)")
    noise_multiplier: float | None = Field(None, gt=0.0, description="alternative to epsilon: sigma itself")
    delta: float | None = Field(None, gt=0.0, lt=1.0, description="None: 1/(10 n) rounded down to a power of 10")
    steps: int = Field(200, gt=0)
    batch_size: int = Field(64, gt=0, description="expected logical batch (DP: Poisson rate batch_size / n)")
    physical_batch_size: int = Field(64, gt=0)
    lr: float = Field(0.01, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0, description="per-example clipping norm (DP only)")
    train_backbone: bool = Field(True, description="False: only the new head is trained")
    accountant: Literal["prv", "rdp"] = "prv"

    @model_validator(mode="after")
    def _check(self) -> FinetuneProtocol:
        given = [k for k in ("epsilon", "noise_multiplier") if getattr(self, k) is not None]
        if self.dp and len(given) != 1:
            raise ValueError("dp is true: set exactly one of epsilon (the target epsilon) or noise_multiplier, "
                             f"got {given or 'neither'}")
        if not self.dp and given:
            raise ValueError(f"{given[0]} is set but dp is false; set dp: true or remove {given[0]}")
        return self


class DiagnosticsProtocol(Strict):
    """Per-layer separation (fuzziness, Fisher, residual) and its geometric decay across ``feature_blocks()``."""

    enabled: bool = True
    max_examples: int = Field(2000, gt=1, description="training examples used (seeded class-balanced subset)")


class Protocols(Strict):
    linear_probe: LinearProbeProtocol = Field(default_factory=LinearProbeProtocol)
    knn: KnnProtocol = Field(default_factory=KnnProtocol)
    finetune: FinetuneProtocol = Field(default_factory=FinetuneProtocol)
    diagnostics: DiagnosticsProtocol = Field(default_factory=DiagnosticsProtocol)


class Budget(Strict):
    """Caps applied to every dataset (on top of each dataset's own limits); None = no cap."""

    max_train_examples: int | None = Field(10000, gt=0)
    max_test_examples: int | None = Field(5000, gt=0)


class TransferSuite(Strict):
    """Everything ``audit transfer`` needs besides the run directory."""

    name: str = Field("transfer", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    datasets: tuple[TransferDataset, ...] = Field(description="downstream datasets, at least one")
    image_size: int | None = Field(None, gt=0, le=MAX_IMAGE_SIZE,
                                   description="resize images to this size (None: the model's input)")
    protocols: Protocols = Field(default_factory=Protocols)
    budget: Budget = Field(default_factory=Budget)
    seed: int = 0
    batch_size: int = Field(256, gt=0, description="batch size of feature extraction and evaluation")
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @model_validator(mode="after")
    def _check(self) -> TransferSuite:
        if not self.datasets:
            raise ValueError("datasets: list at least one dataset (e.g. - name: cifar10, root: PATH)")
        keys = [d.key for d in self.datasets]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(f"datasets: labels must be unique, got {', '.join(dupes)} more than once; "
                             "give each entry a distinct 'label'")
        return self


def load_suite(path: str | os.PathLike[str], overrides: Overrides = ()) -> TransferSuite:
    """Read a suite YAML (``yaml.safe_load``), apply ``--set key=value`` overrides, validate.

    Raises:
        ConfigError: missing file, bad YAML, unknown key (named, with the valid ones) or bad value.
    """
    data = apply_overrides(load_yaml(path), overrides)
    return parse_suite(data, source=f"transfer suite error in {path}")


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """Valid keys of the suite section that owns the last element of ``loc`` (list indices skipped)."""
    current: Any = TransferSuite
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(str(part)) if isinstance(current, type) else None
        if field is None:
            return []
        ann = field.annotation
        candidates = (ann, *getattr(ann, "__args__", ()))
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if current is None:
            return []
    return sorted(current.model_fields) if isinstance(current, type) else []


def parse_suite(data: dict[str, Any], *, source: str = "transfer suite") -> TransferSuite:
    """Validate a mapping into a :class:`TransferSuite`; problems become one-line :class:`ConfigError`.

    An unknown key is reported with its dotted path (``datasets.1.rot``), the valid keys of its section
    and the closest match.

    >>> parse_suite({"datasets": [{"name": "digits", "rot": "/d"}]})
    Traceback (most recent call last):
    ...
    foundation.errors.ConfigError: transfer suite: unknown key 'datasets.0.rot' (valid keys here: label, name, \
root, test_limit, test_split, train_limit, train_split); did you mean 'root'?
    """
    try:
        return TransferSuite.model_validate(data)
    except ValidationError as exc:
        msgs = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            key = ".".join(str(p) for p in loc) or "(top level)"
            if err["type"] == "extra_forbidden":
                valid = _fields_at(loc)
                close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                msgs.append(f"unknown key '{key}' (valid keys here: {', '.join(valid)}){hint}")
            elif err["type"] == "value_error":
                msg = str(err["msg"]).removeprefix("Value error, ")
                msgs.append(f"{key}: {msg}" if loc else msg)
            else:
                got = err.get("input")
                msgs.append(f"{key}: {err['msg']}" + ("" if isinstance(got, dict) else f", got {got!r}"))
        more = f" (+{len(msgs) - 3} more)" if len(msgs) > 3 else ""
        raise ConfigError(f"{source}: " + "; ".join(msgs[:3]) + more) from None
