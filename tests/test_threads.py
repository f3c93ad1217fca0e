"""The torch thread policy (training/threads.py): cores from affinity and cgroup quota, shares per rank and per
Ray task, the load average, the work, the user's choice in the environment, and what the manifest records.

The policy is checked against a slow, obviously correct restatement of its rules over a grid of machines
(:func:`_reference`), besides named cases.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from foundation.errors import ConfigError
from training.config import TrainConfig, apply_overrides
from training.threads import (LAUNCHER_OMP_ENV, PARALLEL_WORK, THREADS_ENV, Cores, ThreadBudget, cgroup_cpu_quota,
                              detect_cores, model_work, plan_threads, rank_budget, requested_threads, using_threads)

from fixtures_runs import TINY_TRAIN

BIG, SMALL = 10 * PARALLEL_WORK, PARALLEL_WORK // 10


def _quiet(n: int, *, machine: int | None = None, load: float | None = 0.0) -> Cores:
    return detect_cores(affinity=set(range(n)), quota=None, machine=machine or n, load=load)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_affinity_of_1_2_4_cores_on_a_quiet_machine(n: int) -> None:
    cores = _quiet(n)
    assert cores.available == n and "affinity" in cores.source
    assert plan_threads(role="process", cores=cores, work=BIG, environ={}).threads == n
    assert plan_threads(role="process", cores=cores, work=SMALL, environ={}).threads == 1  # small model: one
    assert plan_threads(role="process", cores=cores, work=None, environ={}).threads == n


def test_affinity_counts_not_the_machine_and_a_quota_caps_it(tmp_path: Path) -> None:
    # taskset to 2 of 16 cores: 2 threads, even though the machine has 16 and is idle
    assert plan_threads(role="process", cores=_quiet(2, machine=16), work=BIG, environ={}).threads == 2
    (tmp_path / "cpu.max").write_text("250000 100000\n")          # docker --cpus 2.5
    quota = cgroup_cpu_quota(tmp_path)
    assert quota == 2.5
    cores = detect_cores(affinity=set(range(16)), quota=quota, machine=16, load=0.0)
    assert cores.available == 3 and "cgroup quota 2.5" in cores.source
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(v1) is None                           # v1 without a quota
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    assert cgroup_cpu_quota(v1) == 1.0
    assert cgroup_cpu_quota(tmp_path / "absent") is None
    assert detect_cores(affinity={0, 1}, quota=8.0, machine=2, load=None).available == 2  # quota above the mask


def test_a_loaded_machine_gets_one_thread_and_a_half_busy_one_the_free_cores() -> None:
    assert plan_threads(role="process", cores=_quiet(2, load=3.0), work=BIG, environ={}).threads == 1
    assert plan_threads(role="process", cores=_quiet(2, load=1.9), work=BIG, environ={}).threads == 1
    assert plan_threads(role="process", cores=_quiet(8, load=5.0), work=BIG, environ={}).threads == 4
    plan = plan_threads(role="process", cores=_quiet(2, load=3.0), work=BIG, environ={})
    assert "load average 3.00" in plan.reason
    # a container with 4 of a 64-core host's cores: the host's load counts in proportion
    host = detect_cores(affinity=set(range(4)), quota=None, machine=64, load=16.0)
    assert plan_threads(role="process", cores=host, work=BIG, environ={}).threads == 3


@pytest.mark.parametrize(("cores", "ranks", "want"), [(2, 2, 1), (4, 2, 2), (8, 2, 4), (4, 3, 1), (16, 4, 4),
                                                       (1, 2, 1)])
def test_ranks_per_node_share_the_cores(cores: int, ranks: int, want: int) -> None:
    budget = rank_budget({"LOCAL_WORLD_SIZE": str(ranks), "WORLD_SIZE": str(2 * ranks)})
    assert budget == ThreadBudget(role="rank", processes=ranks)
    # the ranks' own threads are in the load average: a load of `ranks` is a quiet machine
    plan = budget.plan(work=BIG, cores=_quiet(cores, load=float(ranks)), environ={})
    assert plan.threads == want and plan.processes == ranks
    assert budget.plan(work=SMALL, cores=_quiet(cores), environ={}).threads == 1
    assert rank_budget({}) == ThreadBudget(role="rank", processes=1)


@pytest.mark.parametrize(("cpus", "want"), [(0.5, 1), (1.0, 1), (2.0, 2), (3.5, 3)])
def test_a_ray_task_uses_the_cpus_ray_reserved(cpus: float, want: int) -> None:
    task = ThreadBudget(role="ray_task", task_cpus=cpus)
    loaded = _quiet(8, load=30.0)  # Ray's own tasks load the node: the reservation decides, not the load
    ray_env = {"OMP_NUM_THREADS": "8"}  # what Ray writes into a worker's environment
    assert task.plan(work=BIG, cores=loaded, environ=ray_env).threads == want
    assert task.plan(work=SMALL, cores=loaded, environ=ray_env).threads == 1
    assert task.plan(work=BIG, cores=loaded, environ={THREADS_ENV: "1"}).threads == 1
    with pytest.raises(ValueError, match="task_cpus > 0"):
        ThreadBudget(role="ray_task").plan(work=BIG, cores=loaded, environ={})


def test_the_users_choice_in_the_environment_wins() -> None:
    cores = _quiet(4, load=10.0)
    plan = plan_threads(role="process", cores=cores, work=SMALL, environ={"OMP_NUM_THREADS": "3"})
    assert plan.threads == 3 and "OMP_NUM_THREADS=3" in plan.reason
    assert plan_threads(role="process", cores=cores, work=SMALL, environ={THREADS_ENV: "all",
                                                                        "OMP_NUM_THREADS": "1"}).threads == 4
    assert plan_threads(role="rank", cores=_quiet(4), processes=2, work=BIG,
                        environ={THREADS_ENV: "all"}).threads == 2
    # the launcher's OMP_NUM_THREADS=1 (torchrun wants it) is not the user's choice
    launched = {"OMP_NUM_THREADS": "1", LAUNCHER_OMP_ENV: "1"}
    assert requested_threads("rank", launched) is None
    assert plan_threads(role="rank", cores=_quiet(8, load=2.0), processes=2, work=BIG, environ=launched).threads == 4
    for bad in ("0", "two", "-1"):
        with pytest.raises(ConfigError, match=f"{THREADS_ENV} must be a positive integer or all; got '{bad}'"):
            requested_threads("process", {THREADS_ENV: bad})
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS must be a positive integer; got '0'"):
        requested_threads("process", {"OMP_NUM_THREADS": "0"})


def _reference(*, available: int, machine: int, load: float, processes: int, work: int) -> int:
    """The policy restated as a loop: the most threads t such that every rule allows t (at least one)."""
    best = 1
    for t in range(1, available + 1):
        fits_share = t * processes <= available
        big_enough = work >= PARALLEL_WORK
        others = max(0.0, load - processes) * available / machine  # other jobs' threads on our cores
        fits_free = t * processes + others <= available + 1e-9
        if fits_share and big_enough and fits_free:
            best = t
    return best


def test_the_policy_matches_its_rules_stated_as_a_loop_and_never_oversubscribes() -> None:
    for available, extra, load, processes, work in itertools.product(
            [1, 2, 3, 4, 8], [0, 4], [0.0, 0.5, 1.0, 2.0, 3.5, 7.0, 20.0], [1, 2, 3], [SMALL, BIG]):
        machine = available + extra
        cores = Cores(available=available, source="test", machine=machine, load=load)
        role = "process" if processes == 1 else "rank"
        got = plan_threads(role=role, cores=cores, processes=processes, work=work, environ={}).threads
        want = _reference(available=available, machine=machine, load=load, processes=processes, work=work)
        assert got == want, (available, machine, load, processes, work, got, want)
        assert got * processes <= max(available, processes)  # never more threads than cores (one at least)


def test_model_work_and_using_threads_restores_the_count() -> None:
    assert model_work(params=1000, input_shape=(3, 32, 32)) == 1024 * 1000
    assert model_work(params=10, input_shape=[5], models=4) == 40
    before = torch.get_num_threads()
    plan = plan_threads(role="process", cores=_quiet(2), work=BIG, environ={THREADS_ENV: "2"})
    with using_threads(plan):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before


def test_a_trained_run_records_its_threads_and_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from training.trainer import train

    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    cfg = TrainConfig.model_validate(apply_overrides(TINY_TRAIN, {"output_dir": str(tmp_path)}))
    threads = train(cfg, progress=False).manifest.provenance.threads
    assert threads["threads"] == 1 and "small model" in threads["reason"]  # a tiny model: one thread
    assert threads["role"] == "process" and threads["cores_available"] >= 1 and threads["work"] < PARALLEL_WORK
    assert torch.get_num_threads() == before
    monkeypatch.setenv(THREADS_ENV, "2")
    again = train(cfg.model_copy(update={"name": "again"}), progress=False).manifest.provenance.threads
    assert again["threads"] == 2 and again["reason"] == f"{THREADS_ENV}=2 in the environment"
    assert math.isfinite(again["load_average"] or 0.0)
