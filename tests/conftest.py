"""Shared test fixtures.

Every test here runs tiny models on tiny data: torch's thread start-up and contention on a shared 2-core machine
would dominate, so the whole session runs on one torch thread (restored at the end), and ``DP_AUDIT_THREADS=1``
tells the thread policy (training/threads.py) and every process a test starts to use one thread too (tests of the
policy itself pass their own environment). Modules change the thread count only through that policy.

Evidence files are signed (:mod:`foundation.evidence`): the session uses a fixed test key through
``DP_AUDIT_EVIDENCE_KEY`` (set at import, so subprocesses and doctests inherit it), never the user's own key.

Memory: glibc serves every allocation above 32 MB (a batched trainer's per-example gradients of 16 models) with a
fresh ``mmap`` and unmaps it on free, so each step faults its pages in again: the README's vendor flow spent more
CPU in the kernel than in torch (34 M page faults). The session keeps freed memory in the heap instead
(``mallopt``: no mmap, no trimming) and tells every process it starts the same through ``MALLOC_MMAP_MAX_`` and
``MALLOC_TRIM_THRESHOLD_``: same results, same code paths, 3x fewer page faults and less kernel time (glibc only;
elsewhere nothing changes).

README blocks (tests/test_readme.py) are separate processes in their own temporary directories: once the session
has collected its tests they start in a background thread, one after another, and run on the second core while
the other tests run on the first; each README test waits for its block. A session stopped early kills them.
"""

from __future__ import annotations

import ctypes
import os

import pytest
import torch

#: The test session's evidence key (tests that forge evidence with another key use their own).
TEST_EVIDENCE_KEY = "dp-audit-test-session-evidence-key-" + "5" * 32
os.environ["DP_AUDIT_EVIDENCE_KEY"] = TEST_EVIDENCE_KEY
os.environ.pop("DP_AUDIT_EVIDENCE_KEY_FILE", None)

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
_KEEP_FREED = 1 << 34  # 16 GiB: never give freed heap back to the kernel mid-session


def _keep_freed_memory() -> None:
    """Serve large allocations from the heap and keep freed memory there, here and in every child process."""
    os.environ.setdefault("MALLOC_MMAP_MAX_", "0")
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(_KEEP_FREED))
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: its allocator is left as it is
        return
    libc.mallopt(_M_MMAP_MAX, int(os.environ["MALLOC_MMAP_MAX_"]))
    libc.mallopt(_M_TRIM_THRESHOLD, min(int(os.environ["MALLOC_TRIM_THRESHOLD_"]), 2**31 - 1))


_keep_freed_memory()


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One torch intra-op thread for the whole test session."""
    before, env = torch.get_num_threads(), os.environ.get("DP_AUDIT_THREADS")
    torch.set_num_threads(1)
    os.environ["DP_AUDIT_THREADS"] = "1"
    yield
    torch.set_num_threads(before)
    if env is None:
        os.environ.pop("DP_AUDIT_THREADS", None)
    else:
        os.environ["DP_AUDIT_THREADS"] = env


_README_TEST = "test_readme_block_runs_pasted_alone"
_README_RUNNER = pytest.StashKey[object]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the README blocks this session checks in the background (tests/test_readme.py: they are separate
    processes in their own directories, so they run on the second core while the other tests run on the first)."""
    if session.config.option.collectonly:
        return
    items = [item for item in session.items if getattr(item, "originalname", None) == _README_TEST]
    if items:
        runner = items[0].module.RUNNER
        alone = len(items) == len(session.items)
        runner.start([item.callspec.params["block"] for item in items], workers=min(2, os.cpu_count() or 1) if alone
                     else 1)
        session.config.stash[_README_RUNNER] = runner


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the README blocks still queued or running (a session stopped early by -x, a failure or Ctrl-C)."""
    runner = session.config.stash.get(_README_RUNNER, None)
    if runner is not None:
        runner.stop()
