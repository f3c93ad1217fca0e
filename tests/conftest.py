"""Shared test fixtures.

Every test here runs tiny models on tiny data: torch's thread start-up and contention on a shared 2-core machine
would dominate, so the whole session runs on one torch thread (restored at the end). Modules must not change the
thread count themselves.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One torch intra-op thread for the whole test session."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
