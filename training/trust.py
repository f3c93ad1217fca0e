"""Which code a run directory names, and the refusal to run it unless the user trusts whoever made it.

A run directory names code when one of its ``model.arch`` fields is an import path
(``package.module:factory``): building that model imports the module, which runs its top-level code, and
calls the factory. Registered architectures (``small_cnn``, ``mlp``, ``resnet20_cifar``) and timm names are
registry look-ups and run no code from the run (timm resolves string options such as ``act_layer`` through its
own name tables, never by import; JSON and YAML cannot hold callables). A reviewer auditing a run directory
made by someone else must not execute that someone's code by accident, so every auditing entry point calls
:func:`require_code_trust` before it reads anything else, and :func:`training.models.build_model` refuses import
paths unless it is given ``trust_code=True`` (the same rule, enforced where the import would happen).

The fields that can name code, all scanned here:

* ``manifest.json``: ``model.arch`` (the audited model, rebuilt to load its weights);
* ``config.yaml`` (and the file ``provenance.config_file`` names): ``model.arch`` (the recipe, rebuilt for
  reference models) and ``training.finetune.checkpoint`` when it is a run directory: that directory's
  ``manifest.json`` ``model.arch`` (a fine-tuning recipe rebuilds its starting checkpoint);
* ``shadows/<k>/manifest.json`` and ``shadows/<k>/config.yaml``: reference models shipped with the run.

Nothing else in a run directory names code: ``import.json``, ``shadows/index.json``, ``attack.json``,
``epsilon.json`` and ``transfer.json`` name datasets and registered attacks only, and weights are read as
safetensors or with ``torch.load(weights_only=True)``.

>>> import json, tempfile
>>> run = Path(tempfile.mkdtemp())
>>> _ = (run / MANIFEST_FILE).write_text(json.dumps({"model": {"arch": "os:system"}}))
>>> [str(ref) for ref in code_in_run(run)]
["model.arch = 'os:system' in manifest.json"]
>>> require_code_trust(run, trust_code=False)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
foundation.errors.UntrustedCodeError: run dir ... (model.arch = 'os:system' in manifest.json); refusing ... --trust-code ...
>>> require_code_trust(run, trust_code=True).to_dict()
{'trust_code': True, 'names_code': ["model.arch = 'os:system' in manifest.json"]}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundation.errors import UntrustedCodeError
from training.models import names_code
from foundation.files import CONFIG_FILE, MANIFEST_FILE, SHADOW_DIR

__all__ = ["CodeRef", "CodeTrust", "code_in_run", "require_code_trust", "TRUST_FLAG"]

TRUST_FLAG = "--trust-code"
_MAX_SHADOWS = 10_000


@dataclass(frozen=True)
class CodeRef:
    """One field of a run directory that names code: ``field = value`` in ``file`` (relative to the run)."""

    file: str
    field: str
    value: str

    def __str__(self) -> str:
        return f"{self.field} = {self.value!r} in {self.file}"


@dataclass(frozen=True)
class CodeTrust:
    """What code a run names and whether the user trusted it (recorded in attack/epsilon/transfer results).

    Attributes:
        trust_code: whether the user passed ``--trust-code`` (``trust_code=True``).
        code: the fields that name code (empty: only registered and timm architectures).
    """

    trust_code: bool
    code: tuple[CodeRef, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"trust_code": self.trust_code, "names_code": [str(ref) for ref in self.code]}


def _read(path: Path) -> Any:
    """The parsed JSON or YAML at ``path``, or None when it is absent or unreadable (its own reader refuses it)."""
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            return json.loads(text)
        import yaml

        return yaml.safe_load(text)
    except Exception:  # any read or parse error: the file's own reader reports it
        return None


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _arch_ref(data: Any, file: str) -> list[CodeRef]:
    arch = _get(data, "model", "arch")
    return [CodeRef(file, "model.arch", arch)] if isinstance(arch, str) and names_code(arch) else []


def _config_refs(run_dir: Path, name: str, prefix: str) -> list[CodeRef]:
    data = _read(run_dir / name)
    refs = _arch_ref(data, prefix + name)
    checkpoint = _get(data, "training", "finetune", "checkpoint")
    if isinstance(checkpoint, str) and checkpoint and Path(checkpoint).is_dir():
        refs += [CodeRef(f"{prefix}{name} -> training.finetune.checkpoint {checkpoint}/{MANIFEST_FILE}", r.field,
                         r.value) for r in _arch_ref(_read(Path(checkpoint) / MANIFEST_FILE), "")]
    return refs


def _dir_refs(run_dir: Path, prefix: str = "") -> list[CodeRef]:
    manifest = _read(run_dir / MANIFEST_FILE)
    refs = _arch_ref(manifest, prefix + MANIFEST_FILE)
    names = [CONFIG_FILE]
    extra = _get(manifest, "provenance", "config_file")
    if isinstance(extra, str) and extra not in names and Path(extra).name == extra:
        names.append(extra)
    for name in names:
        refs += _config_refs(run_dir, name, prefix)
    return refs


def code_in_run(run_dir: str | os.PathLike[str]) -> list[CodeRef]:
    """Every field of ``run_dir`` that names code (see the module docstring); reads JSON and YAML only.

    Files that are absent or do not parse are skipped: their own readers refuse them later, and
    :func:`training.models.build_model` refuses an import path it is not trusted with in any case.
    """
    run_dir = Path(run_dir)
    refs = _dir_refs(run_dir)
    shadows = run_dir / SHADOW_DIR
    if shadows.is_dir():
        for k, sub in enumerate(sorted(p for p in shadows.iterdir() if p.is_dir())):
            if k >= _MAX_SHADOWS:
                break
            refs += _dir_refs(sub, prefix=f"{SHADOW_DIR}/{sub.name}/")
    return refs


def require_code_trust(run_dir: str | os.PathLike[str], *, trust_code: bool) -> CodeTrust:
    """Refuse ``run_dir`` when it names code and ``trust_code`` is False; else what it names and the trust.

    Call it first when opening a run directory someone else may have made (``audit attack``, ``epsilon``,
    ``transfer``), and pass the same ``trust_code`` on to every model build.

    Raises:
        UntrustedCodeError: the run names code and ``trust_code`` is False; one line naming the first field,
            its value, the file and the flag that allows it. Nothing was imported.
    """
    refs = tuple(code_in_run(run_dir))
    if refs and not trust_code:
        more = f" and {len(refs) - 1} more" if len(refs) > 1 else ""
        raise UntrustedCodeError(f"run dir {run_dir} names code to import ({refs[0]}{more}); refusing to run it. "
                                 f"Pass {TRUST_FLAG} if you trust who made this run directory")
    return CodeTrust(trust_code=bool(trust_code), code=refs)
