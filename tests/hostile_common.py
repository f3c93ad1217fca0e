"""Helpers shared by the hostile-input suites: tests/test_hostile_inputs.py, _runs.py and _code.py.

Every hostile case goes through the command line and must end the same way (:func:`assert_error`): exit code 2,
one line on stderr starting with ``error:`` that names the problem, no traceback. :class:`Payload` is the
malicious pickle: unpickling it runs ``touch <marker>``, so a test proves no code ran by the marker's absence.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable

import yaml
from click.testing import CliRunner

from audit.cli import main
from foundation.io import sha256_file, write_json

__all__ = ["TINY", "ATTACK_ARGS", "Payload", "write_cfg", "cli", "assert_error", "edit_json", "rehash",
           "set_key"]

#: A DP run small enough to train in about a second: digits, an MLP, 6 steps.
TINY: dict[str, Any] = {
    "name": "tiny",
    "data": {"dataset": "digits", "pool_size": 240, "test_size": 60},
    "model": {"arch": "mlp", "kwargs": {"hidden": [16]}},
    "privacy": {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1e-4},
    "optim": {"name": "sgd", "lr": 0.5},
    "training": {"steps": 6, "batch_size": 32, "physical_batch_size": 32, "checkpoint_every": 2,
                 "progress": False, "log_every": 2, "device": "cpu"},
    "attack": {"n_reference": 0, "attacks": ["loss", "attack_p"], "population": 20, "n_bootstrap": 5,
               "device": "cpu"},
    "epsilon": {"sources": ["pool"], "attack": "loss"},
}
#: `audit attack` settings that need no reference models (seconds).
ATTACK_ARGS = ["--set", "attack.n_reference=0", "--set", "attack.attacks=[loss,attack_p]", "--set",
               "attack.population=20", "--set", "attack.n_bootstrap=5", "--set", "attack.device=cpu", "--no-progress"]


class Payload:
    """A malicious pickle: unpickling it calls ``os.system("touch <marker>")``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def set_key(data: dict[str, Any], dotted: str, value: Any) -> None:
    """``data[a][b][c] = value`` for ``dotted = "a.b.c"`` (sections created as needed)."""
    node = data
    *parents, last = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value


def write_cfg(path: Path, output_dir: Path, **over: Any) -> Path:
    """:data:`TINY` with ``output_dir`` and dotted-key overrides, written as YAML to ``path``."""
    data = json.loads(json.dumps(TINY))
    data["output_dir"] = str(output_dir)
    for key, value in over.items():
        set_key(data, key, value)
    path.write_text(yaml.safe_dump(data))
    return path


def cli(*args: Any):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_error(result, pattern: str) -> str:
    """Exit 2, the last line starts with ``error:`` and matches ``pattern``, no other error line, no traceback."""
    out = result.output.strip()
    assert result.exit_code == 2, (result.exit_code, out, result.exception)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error: "), out
    assert "Traceback" not in out and not any(ln.startswith("error: ") for ln in lines[:-1]), out
    assert re.search(pattern, lines[-1]), lines[-1]
    return lines[-1]


def edit_json(path: Path, fn: Callable[[Any], Any]) -> None:
    data = json.loads(path.read_text())
    fn(data)
    write_json(path, data)


def rehash(run: Path, file: str = "model.safetensors") -> None:
    """What a vendor does after editing a file: record its new sha256 in the manifest, so only content checks
    (not the sha256 comparison) can catch the edit."""
    key = {"model.safetensors": ("model", "weights_sha256"), "membership.npy": ("data", "membership_sha256"),
           "config.yaml": ("provenance", "config_sha256")}[file]
    digest = sha256_file(run / file)
    edit_json(run / "manifest.json", lambda m: m[key[0]].__setitem__(key[1], digest))
