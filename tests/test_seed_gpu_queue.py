"""experiments.gpu.queue, which spends scarce GPU minutes: the soft deadline counts from the ready
queue, a failing job is logged while the others go on, and the hard deadline stops a job that would overrun."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from experiments.gpu import queue


def fake_job(kind, name, key, base="gpu", part=None):
    """Stands in for experiments.gpu.queue._job in the worker processes: ``name`` says how it behaves."""
    t0 = time.time()
    if name == "boom":
        raise RuntimeError("the job broke")
    time.sleep({"fast": 0.05, "medium": 2.0, "slow": 60.0}[name])
    return {"kind": kind, "name": name, "key": key, "part": part, "seconds": time.time() - t0,
            "end": time.time()}


def _run(monkeypatch, tmp_path, todo, *, setup=0.0, **kw):
    def pending(*_):
        time.sleep(setup)  # the imports and the scan of finished runs, before the queue is ready
        return list(todo)

    monkeypatch.setattr(queue, "jobs", pending)
    monkeypatch.setattr(queue, "SIGMA_CACHE", tmp_path / "sigma")
    log = tmp_path / "jobs.jsonl"
    queue.run([], True, kw.pop("workers", 2), kw.pop("soft"), kw.pop("hard"), job=fake_job, log_path=log, **kw)
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture(autouse=True)
def _keep_cwd(monkeypatch):
    monkeypatch.chdir(Path.cwd())  # run() changes into the repository root


def test_soft_deadline_counts_from_the_ready_queue(monkeypatch, tmp_path):
    todo = [("run", "fast", f"k{i}", "gpu") for i in range(3)]
    # one worker per job: every job is submitted at once when the queue is ready, so how long worker processes take
    # to start on a loaded machine cannot push a submission past the soft deadline
    recs = _run(monkeypatch, tmp_path, todo, setup=1.5, soft=1.0, hard=120, workers=3)
    assert sorted(r["key"] for r in recs) == ["k0", "k1", "k2"] and {r["status"] for r in recs} == {"done"}


def test_soft_deadline_leaves_the_rest_for_a_later_call(monkeypatch, tmp_path):
    todo = [("run", "medium", "first", "gpu"), ("run", "fast", "later1", "gpu"), ("run", "fast", "later2", "gpu")]
    recs = _run(monkeypatch, tmp_path, todo, workers=1, soft=0.5, hard=120)
    assert [r["key"] for r in recs] == ["first"]


def test_a_failure_is_logged_and_the_hard_deadline_stops_an_overrun(monkeypatch, tmp_path, capsys):
    todo = [("run", "fast", "ok", "gpu"), ("arm", "boom", 3, "gpu", 8.0), ("run", "slow", "long", "gpu")]
    recs = _run(monkeypatch, tmp_path, todo, workers=3, soft=60, hard=8)
    out = capsys.readouterr().out
    assert "failed: RuntimeError('the job broke')" in out and "boom s3 8.0 in" in out  # an arm job names its part
    assert "stopped  slow long after" in out  # the overrun is named, with how long it had run, for the next call
    by = {r["key"]: r for r in recs}
    assert by["ok"]["status"] == "done"
    assert by[3]["status"].startswith("failed: RuntimeError('the job broke')") and by[3]["part"] == 8.0
    assert "long" not in by  # stopped at the hard deadline, never logged as done


def test_a_job_starts_only_once_it_is_ready(monkeypatch, tmp_path):
    # the fine-tuning variants wait for their source: neither starts before the source is logged as done
    log = tmp_path / "jobs.jsonl"
    todo = [("run", "fast", "ft1", "gpu"), ("run", "medium", "source", "gpu"), ("run", "fast", "ft2", "gpu")]

    def is_ready(j):
        return j[2] == "source" or (log.exists() and '"source"' in log.read_text())

    recs = _run(monkeypatch, tmp_path, todo, workers=3, soft=60, hard=120, is_ready=is_ready)
    assert [r["key"] for r in recs][0] == "source" and sorted(r["key"] for r in recs[1:]) == ["ft1", "ft2"]
    by = {r["key"]: r for r in recs}
    assert min(by[k]["end"] - by[k]["seconds"] for k in ("ft1", "ft2")) >= by["source"]["end"] - 0.5


def test_jobs_that_can_never_start_end_the_queue(monkeypatch, tmp_path, capsys):
    t0 = time.time()
    recs = _run(monkeypatch, tmp_path, [("run", "fast", "ft", "gpu")], soft=60, hard=120, is_ready=lambda j: False)
    assert recs == [] and time.time() - t0 < 30 and "1 job(s) wait for what did not run" in capsys.readouterr().out


def test_the_fine_tuning_variants_queue_behind_their_source(monkeypatch, tmp_path):
    monkeypatch.setattr(queue, "ROOT", tmp_path)  # no run has finished under this root
    todo = queue.jobs([], True, scale="gpu_full", configs=("finetune",))
    # 5 seeds × (2 ε × 5 ways + the non-DP LP and FFT references)
    assert queue._label(todo[0]) == "finetune_source" and len(todo) == 1 + 5 * (2 * 5 + 2)
    assert queue.ready(todo[0]) and not any(queue.ready(j) for j in todo[1:])
    assert [j[2] for j in todo[1:6]] == ["lp-e1-s0", "fft-e1-s0", "lpfft25-e1-s0", "lpfft50-e1-s0", "lpfft75-e1-s0"]
    source = tmp_path / "results/experiments-gpu-full/ft-source"
    source.mkdir(parents=True)
    for f in ("manifest.json", "metrics.json"):
        (source / f).write_text("{}")
    todo = queue.jobs([], True, ["lpfft50-e8"], scale="gpu_full", configs=("finetune",))
    assert [j[2] for j in todo] == [f"lpfft50-e8-s{s}" for s in range(5)] and all(queue.ready(j) for j in todo)
    assert queue.jobs([], False, scale="gpu_full", configs=("finetune",)) == []  # --no-runs
