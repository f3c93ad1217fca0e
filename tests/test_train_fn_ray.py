"""``audit.attack(run, train_fn=..., executor="ray")``: Ray tasks run the user's function (shipped by Ray with
cloudpickle) and give the signals the sequential executor gives; a wrong return value inside a task reaches the
caller as the same one-line error."""

from __future__ import annotations

import builtins
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import Subset

import audit
from attacks.ray_connect import start_local
from foundation.errors import UserError
from foundation.evidence import read_signed_npz
from foundation.files import SIGNALS_FILE

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # starts a local Ray and its worker processes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        pytest.skip("another Ray is already running in this process")
    original_print = builtins.print
    stop = start_local(ray, num_cpus=2, log_to_driver=False, runtime_env={"env_vars": {
        "PYTHONPATH": f"{ROOT / 'tests'}:{ROOT}", "OMP_NUM_THREADS": "1", "DP_AUDIT_THREADS": "1"}})
    yield ray
    stop()
    builtins.print = original_print


def test_ray_tasks_give_the_sequential_signals(local_ray, tmp_path):
    from test_train_fn_attack import _data, fit

    train = _data(120)
    run = fit(audit.AuditPool(train, seed=5), seed=1, run_dir=tmp_path / "run", epochs=5).run_dir

    def train_fn(member_indices, seed):
        return fit(Subset(train, member_indices), seed, epochs=5)

    seq = audit.attack(run, train_fn=train_fn, overrides={"attack.n_reference": 2})
    phi_seq = read_signed_npz(run / SIGNALS_FILE, remake="")["pool"]
    on_ray = audit.attack(run, train_fn=train_fn, executor="ray", retrain_shadows=True,
                          overrides={"attack.n_reference": 2})
    phi_ray = read_signed_npz(run / SIGNALS_FILE, remake="")["pool"]
    assert on_ray.report.setup.executor == "ray" and on_ray.shadows_trained == 2
    np.testing.assert_allclose(phi_ray, phi_seq, atol=1e-4)
    np.testing.assert_allclose(on_ray.scores["rmia_online"], seq.scores["rmia_online"], atol=1e-3)

    with pytest.raises(UserError, match="returned None for reference model"):
        audit.attack(run, train_fn=lambda idx, seed: None, executor="ray", retrain_shadows=True,
                     overrides={"attack.n_reference": 2})
