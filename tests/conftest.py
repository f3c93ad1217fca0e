"""Shared test fixtures.

Every test here runs tiny models on tiny data: torch's thread start-up and contention on a shared 2-core machine
would dominate, so the whole session runs on one torch thread (restored at the end), and ``DP_AUDIT_THREADS=1``
tells the thread policy (training/threads.py) and every process a test starts to use one thread too (tests of the
policy itself pass their own environment). Modules change the thread count only through that policy.

Evidence files are signed (:mod:`foundation.evidence`): the session uses a fixed test key through
``DP_AUDIT_EVIDENCE_KEY`` (set at import, so subprocesses and doctests inherit it), never the user's own key.
"""

from __future__ import annotations

import os

import pytest
import torch

#: The test session's evidence key (tests that forge evidence with another key use their own).
TEST_EVIDENCE_KEY = "dp-audit-test-session-evidence-key-" + "5" * 32
os.environ["DP_AUDIT_EVIDENCE_KEY"] = TEST_EVIDENCE_KEY
os.environ.pop("DP_AUDIT_EVIDENCE_KEY_FILE", None)


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
