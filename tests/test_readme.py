"""Every README code block runs as pasted, alone, from any directory.

Each ``bash`` block runs in a fresh temporary working directory with ``audit`` on PATH (this interpreter's
``bin/``, i.e. the venv) and nothing left by earlier blocks; each ``python`` block runs there too, in a fresh
interpreter (as a doctest when it is a ``>>>`` session). A block preceded by ``<!-- not-run: REASON -->`` is
skipped with that reason (builds, GPUs, hours). A block that reads the shared data root (``$DP_AUDIT_SHARED``)
is skipped, naming the variable, when that root is absent. Blocks without a language (trees, diagrams) are text.

What it costs (the shared 2-core CPU of 2026-11-27, seven sessions at load 12, one torch thread): the vendor flow
570 s, the gate block (two quickstart variants) 432 s, the quickstart 265-397 s, the ResNet-20 import 306 s, the
transfer block 41-73 s, the rest under a minute each: about 30 min in all, hence `slow`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from foundation.shared_root import SHARED_ENV, shared_root

SHARED = shared_root()

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK_TIMEOUT_S = 1200  # the slowest block trains two audited quickstart variants (about 2 min on 2 cores)

_FENCE = re.compile(r"^```(?P<lang>[A-Za-z]*)\n(?P<body>.*?)^```$", re.S | re.M)
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<reason>.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    body: str
    not_run: str | None


def readme_blocks(text: str) -> list[Block]:
    """The README's ``bash``/``python`` blocks with their line numbers and ``not-run`` reasons.

    >>> bs = readme_blocks("a\\n<!-- not-run: slow -->\\n```bash\\necho hi\\n```\\n```\\ntree\\n```\\n")
    >>> [(b.line, b.lang, b.body, b.not_run) for b in bs]
    [(3, 'bash', 'echo hi\\n', 'slow')]
    """
    blocks = []
    for m in _FENCE.finditer(text):
        lang = m["lang"].lower()
        if lang not in ("bash", "sh", "python"):
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _NOT_RUN.search(before)
        blocks.append(Block(line=line, lang=lang, body=m["body"], not_run=mark["reason"] if mark else None))
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)  # this checkout's code, also for the venv's `audit` script
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    env[SHARED_ENV] = str(SHARED)
    env["HOME"] = env.get("HOME", str(tmp))
    return env


def _command(block: Block, tmp: Path) -> list[str]:
    if block.lang in ("bash", "sh"):
        return ["bash", "-euo", "pipefail", "-c", block.body]
    if block.body.lstrip().startswith(">>>"):
        path = tmp / "block.txt"
        path.write_text(block.body, encoding="utf-8")
        code = ("import doctest, sys\n"
                f"f, a = doctest.testfile({str(path)!r}, module_relative=False, optionflags=doctest.ELLIPSIS)\n"
                "sys.exit(1 if f or not a else 0)")
        return [sys.executable, "-c", code]
    return [sys.executable, "-c", block.body]


def test_readme_has_blocks_and_few_are_skipped() -> None:
    assert len(BLOCKS) >= 8
    skipped = [b for b in BLOCKS if b.not_run]
    assert len(skipped) <= len(BLOCKS) // 2, [b.line for b in skipped]
    assert all(len(b.not_run) > 15 for b in skipped), "every not-run mark gives its reason"


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[f"line{b.line}-{b.lang}" for b in BLOCKS])
def test_readme_block_runs_pasted_alone(block: Block, tmp_path: Path) -> None:
    if block.not_run:
        pytest.skip(f"README line {block.line}: not-run: {block.not_run}")
    if re.search(r"\$\{?" + SHARED_ENV, block.body) and not SHARED.is_dir():
        pytest.skip(f"README line {block.line} reads ${SHARED_ENV} ({SHARED}), which is absent; set {SHARED_ENV}")
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(_command(block, tmp_path), cwd=work, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (f"README line {block.line} failed (exit {proc.returncode}):\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
