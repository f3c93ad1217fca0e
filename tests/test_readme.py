"""Every README code block runs as pasted, alone, from any directory.

Each ``bash`` block runs in a fresh temporary working directory with ``audit`` on PATH (this interpreter's
``bin/``, i.e. the venv) and nothing left by earlier blocks; each ``python`` block runs there too, in a fresh
interpreter (as a doctest when it is a ``>>>`` session). A block preceded by ``<!-- not-run: REASON -->`` is
skipped with that reason (builds, GPUs, hours). A block that reads the shared data root (``$DP_AUDIT_SHARED``)
is skipped, naming the variable, when that root is absent. Blocks without a language (trees, diagrams) are text.

The blocks are processes that share nothing, so they need not wait for their turn: when the session has collected
its tests, ``conftest.py`` hands the blocks it selected to :data:`RUNNER`, which runs them one after another in a
background thread (two at a time when they are all the session runs) while the rest of the suite runs on the
other core; each test then waits for its own block's outcome. What they cost (2026-11-27, one torch thread,
idle 2-core CPU): about 5 min of CPU in all, the vendor flow and the quickstart runs the most (``slow``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
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
    env["DP_AUDIT_THREADS"] = "1"  # as the session's other tests (conftest.py), also when started before them
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


def skip_reason(block: Block) -> str | None:
    """Why ``block`` is not run here, or None."""
    if block.not_run:
        return f"README line {block.line}: not-run: {block.not_run}"
    if re.search(r"\$\{?" + SHARED_ENV, block.body) and not SHARED.is_dir():
        return f"README line {block.line} reads ${SHARED_ENV} ({SHARED}), which is absent; set {SHARED_ENV}"
    return None


@dataclass(frozen=True)
class Outcome:
    """How a block's process ended: its exit code (None: killed after ``BLOCK_TIMEOUT_S``) and its output."""

    returncode: int | None
    stdout: str
    stderr: str
    tmp: Path


class BlockRunner:
    """Runs README blocks in the background, each in its own temporary directory and process group."""

    def __init__(self) -> None:
        self._futures: dict[int, Future[Outcome]] = {}
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._stopped = False

    def start(self, blocks: list[Block], *, workers: int) -> None:
        """Queue ``blocks`` (those a test will check) on ``workers`` threads, in README order."""
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="readme-block")
        for block in blocks:
            if skip_reason(block) is None and block.line not in self._futures:
                self._futures[block.line] = self._pool.submit(self._run, block)

    def outcome(self, block: Block) -> Outcome:
        """The block's outcome: waited for when it was queued, else run now."""
        future = self._futures.get(block.line)
        return future.result() if future is not None else self._run(block)

    def stop(self) -> None:
        """Cancel the blocks not started and kill the process groups still running (end of session)."""
        with self._lock:
            self._stopped = True
            procs = list(self._procs)
        for future in self._futures.values():
            future.cancel()
        for proc in procs:
            _kill_group(proc)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _run(self, block: Block) -> Outcome:
        tmp = Path(tempfile.mkdtemp(prefix=f"readme-line{block.line}-"))
        work = tmp / "work"
        work.mkdir()
        with self._lock:
            if self._stopped:
                return Outcome(None, "", "session ended before the block ran", tmp)
            proc = subprocess.Popen(_command(block, tmp), cwd=work, env=_env(tmp), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                    start_new_session=True)  # its own group: a timeout kills what it started
            self._procs.add(proc)
        try:
            stdout, stderr = proc.communicate(timeout=BLOCK_TIMEOUT_S)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            stdout, stderr = proc.communicate()
            code = None
        finally:
            with self._lock:
                self._procs.discard(proc)
        return Outcome(code, stdout, stderr, tmp)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


RUNNER = BlockRunner()
"""The session's runner; ``conftest.py`` starts it once the tests are collected and stops it at the end."""


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[f"line{b.line}-{b.lang}" for b in BLOCKS])
def test_readme_block_runs_pasted_alone(block: Block) -> None:
    reason = skip_reason(block)
    if reason:
        pytest.skip(reason)
    out = RUNNER.outcome(block)
    how = f"timed out after {BLOCK_TIMEOUT_S} s" if out.returncode is None else f"exit {out.returncode}"
    assert out.returncode == 0, (f"README line {block.line} failed ({how}; its directory: {out.tmp}):\n"
                                 f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    shutil.rmtree(out.tmp, ignore_errors=True)
