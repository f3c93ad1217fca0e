"""The ``ray`` executor of reference models (issue 13, item 1), on a local Ray with 2 CPUs.

- Ray tasks that train batches of models give the weights the in-process batched executor gives, and Ray
  tasks that train one model each with the trainer give the sequential executor's weights;
- a worker killed mid-training (``os._exit`` inside the model's forward, once) is retried, resumes its model from
  the saved state in its staging directory, and the farm completes with the same weights;
- a re-run trains only the missing models; ``shadows/<k>/`` is never half-written (no staging left behind);
- a task's :class:`UserError` reaches the caller as itself.
"""

from __future__ import annotations

import builtins
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures_runs import update_json

from attacks.config import AttackConfig
from attacks.ray_connect import start_local
from attacks.ray_farm import RayOptions, ray_session
from attacks.shadow_ray import STAGING_DIR, plan_tasks
from attacks.shadows import INDEX_FILE, prepare_shadows
from training.config import TrainConfig
from foundation.errors import DataError
from training.run import open_run

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # starts a local Ray and its worker processes


ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = "dp_audit_ray_payload"
PAYLOAD_SOURCE = '''
import os
import pathlib

from torch import nn

_MARKERS = pathlib.Path({markers!r})


class _DiesOnce(nn.Module):
    """Kills its process at the 8th training forward while ``armed`` exists (and disarms itself first)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self._calls = 0

    def forward(self, x):
        if self.training:
            self._calls += 1
            if self._calls == 8 and (_MARKERS / "armed").exists():
                (_MARKERS / "armed").unlink()
                (_MARKERS / "killed").write_text(str(os.getpid()))
                os._exit(1)
        return self.inner(x)


def factory(num_classes, **kwargs):
    from training.models.small import SmallCNN
    return _DiesOnce(SmallCNN(num_classes=num_classes, channels=(4, 8)))
'''


def _config(output_dir: Path, *, arch: str | None = None) -> TrainConfig:
    data = {"name": "target", "output_dir": str(output_dir),
            "data": {"dataset": "synthetic", "split": "train:n=96,classes=4,noise=250",
                     "test_split": "test:n=40,classes=4,noise=250"},
            "privacy": {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1e-3},
            "optim": {"name": "sgd", "lr": 0.2},
            "training": {"steps": 12, "batch_size": 16, "progress": False, "log_every": 100, "checkpoint_every": 3}}
    if arch is not None:
        data["model"] = {"arch": arch}
    return TrainConfig.model_validate(data)


@pytest.fixture(scope="module")
def payload(tmp_path_factory):
    """(code folder holding the payload module, markers folder), the code folder on sys.path."""
    root = tmp_path_factory.mktemp("payload")
    code, markers = root / "code", root / "markers"
    code.mkdir()
    markers.mkdir()
    (code / f"{PAYLOAD}.py").write_text(PAYLOAD_SOURCE.format(markers=str(markers)))
    with pytest.MonkeyPatch.context() as mp:  # the user's code importable for this module's tests, then not
        mp.syspath_prepend(str(code))
        yield code, markers
    sys.modules.pop(PAYLOAD, None)


@pytest.fixture(scope="module")
def local_ray(payload):
    """A private local Ray with 2 CPUs on loopback for this module (as the executor starts it: never a cluster
    found in Ray's address file); its workers import this checkout and the payload."""
    if ray.is_initialized():
        pytest.skip("another Ray is already running in this process")
    path = [str(payload[0]), str(ROOT / "tests"), str(ROOT)]
    original_print = builtins.print  # Ray's driver may swap in its own print: give the next tests theirs back
    stop = start_local(ray, num_cpus=2, log_to_driver=False,
                       runtime_env={"env_vars": {"PYTHONPATH": ":".join(path), "OMP_NUM_THREADS": "1"}})
    yield ray
    stop()
    builtins.print = original_print


def _target(tmp_path: Path, *, arch: str | None = None) -> Path:
    from training.trainer import train

    return train(_config(tmp_path, arch=arch), progress=False, trust_code=arch is not None).run_dir


def _copy(run: Path, dst: Path) -> Path:
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns("shadows", "signals.npz"))
    return dst


def _weights(shadows) -> list[dict[str, torch.Tensor]]:
    return [run.state_dict for run in shadows.runs]


def _max_diff(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> float:
    assert [sorted(x) for x in a] == [sorted(x) for x in b]
    return max(float((x[n].double() - y[n].double()).abs().max()) for x, y in zip(a, b) for n in x)


def test_plan_tasks_covers_every_model_once() -> None:
    for todo, slots, per in (([0, 1, 2, 3, 4, 5, 6], 3, None), ([2, 9], 8, None), (list(range(10)), 2, 4)):
        groups = plan_tasks(todo, kind="batched", slots=slots, models_per_task=per)
        assert [k for g in groups for k in g] == todo
        assert len(groups) == (min(slots, len(todo)) if per is None else -(-len(todo) // per))
    assert plan_tasks([3, 4], kind="sequential", slots=1, models_per_task=5) == [[3], [4]]


def test_ray_options_are_checked() -> None:
    with pytest.raises(ValueError, match="cpus_per_task"):
        RayOptions(cpus_per_task=0)
    with pytest.raises(ValueError, match="local_cpus"):
        RayOptions(cpus_per_task=4, local_cpus=2)
    with pytest.raises(ValueError, match="address"):
        RayOptions(address="")
    with pytest.raises(ValueError, match="ray_"):
        AttackConfig(ray_max_retries=-1)
    with pytest.raises(ValueError, match="executor"):
        AttackConfig(executor="process")  # the home-made process pool is gone
    opts = AttackConfig(executor="ray", ray_address="auto", ray_gpus_per_task=1, workers=2).ray_options()
    assert (opts.address, opts.gpus_per_task, opts.local_cpus) == ("auto", 1.0, 2)


def test_ray_batched_tasks_match_the_batched_executor_and_reruns_skip_finished(local_ray, tmp_path: Path) -> None:
    target = _target(tmp_path / "t")
    batched = prepare_shadows(target=open_run(_copy(target, tmp_path / "batched")), n_models=4, seed=1,
                              executor="batched", device="cpu")
    run = _copy(target, tmp_path / "ray")
    farm = prepare_shadows(target=open_run(run), n_models=4, seed=1, executor="ray", device="cpu",
                           max_models_per_batch=2, ray=RayOptions(max_retries=1))
    assert farm.trained == 4 and farm.executor == "ray" and farm.index["complete"]
    assert (farm.keep == batched.keep).all() and farm.index["seeds"] == batched.index["seeds"]
    assert farm.index["recipe_hash"] == batched.index["recipe_hash"]
    assert _max_diff(_weights(farm), _weights(batched)) < 1e-6
    assert not (run / "shadows" / STAGING_DIR).exists()

    # re-run: nothing to train; then lose one model and re-run: only that one is trained, the others untouched
    assert prepare_shadows(target=open_run(run), n_models=4, seed=1, executor="ray", device="cpu").trained == 0
    update_json(run / "shadows", INDEX_FILE, lambda index: index.update(complete=False))  # re-signed, as the auditor
    shutil.rmtree(run / "shadows" / "2")
    stamps = {k: (run / "shadows" / str(k) / "model.safetensors").stat().st_mtime_ns for k in (0, 1, 3)}
    again = prepare_shadows(target=open_run(run), n_models=4, seed=1, executor="ray", device="cpu")
    assert again.trained == 1 and again.index["complete"]
    assert stamps == {k: (run / "shadows" / str(k) / "model.safetensors").stat().st_mtime_ns for k in (0, 1, 3)}
    assert _max_diff(_weights(again), _weights(batched)) < 1e-6


def test_a_killed_trainer_task_is_retried_and_resumes_to_the_sequential_weights(local_ray, payload,
                                                                                tmp_path: Path) -> None:
    _, markers = payload
    target = _target(tmp_path / "t", arch=f"{PAYLOAD}:factory")  # an import-path arch: batched refuses it
    seq = prepare_shadows(target=open_run(_copy(target, tmp_path / "seq"), trust_code=True), n_models=2, seed=2,
                          executor="sequential", device="cpu")
    (markers / "armed").write_text("kill the first worker that reaches its 8th training step")
    run = _copy(target, tmp_path / "ray")
    farm = prepare_shadows(target=open_run(run, trust_code=True), n_models=2, seed=2, executor="ray",
                           device="cpu", ray=RayOptions(max_retries=2))
    assert (markers / "killed").exists() and not (markers / "armed").exists()  # a worker did die mid-way
    assert farm.trained == 2 and farm.index["complete"] and farm.executor == "ray"
    assert _max_diff(_weights(farm), _weights(seq)) < 1e-6
    assert not (run / "shadows" / STAGING_DIR).exists()


def _raises_data_error(task: int, shared: None) -> int:
    if task == 1:
        raise DataError(f"task {task}: the data root is missing on this node")
    return task


def _doubles(task: int, shared: int) -> int:
    return task * shared


def test_farm_returns_results_in_task_order_and_passes_user_errors_through(local_ray) -> None:
    print_before = builtins.print
    with ray_session(RayOptions()) as session:
        assert session.slots == 2
        seen: list[int] = []
        assert session.run(_doubles, [3, 1, 2], shared=10, on_done=seen.append) == [30, 10, 20]
        assert sorted(seen) == [0, 1, 2]
        with pytest.raises(DataError, match="task 1: the data root is missing"):
            session.run(_raises_data_error, [0, 1], shared=None)
    assert ray.is_initialized()  # a Ray the session did not start is left running
    assert builtins.print is print_before  # and the driver's print is its own again
    assert np.isfinite(session.slots)


def test_cli_refuses_a_malformed_ray_address_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from audit.cli import main

    target = _target(tmp_path)
    res = CliRunner().invoke(main, ["attack", str(target), "--ray-address", "nonsense", "--no-progress"])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert "address must be 'auto', 'ray://host:port'" in res.output
    assert not (target / "shadows").exists()
