"""Where the seed-paper experiments read and write: the checkout they run from (its ``results/``, ``eval_configs/``
and ``.device_data/``), not the installed package's folder."""

from __future__ import annotations

from pathlib import Path

#: the repository root: the experiments' configs, data slices and results live under it
ROOT = Path(__file__).resolve().parents[1]
#: the committed tables (``results/reference``)
REFERENCE = ROOT / "results/reference"
