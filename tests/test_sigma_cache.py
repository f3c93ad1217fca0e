"""The opt-in σ calibration cache: same answers as no cache, one computation per argument tuple, no collisions."""

from __future__ import annotations

import json
import time

import pytest

import training.accounting.calibrate as calibrate
from training.accounting import noise_multiplier_for
from training.accounting.sigma_cache import SIGMA_CACHE_ENV

ARGS = dict(target_epsilon=3.0, sample_rate=0.02, steps=200, delta=1e-5, accountant="rdp")


def _counting(monkeypatch):
    calls = []
    real = calibrate._calibrate

    def wrapped(*a):
        calls.append(a)
        return real(*a)

    monkeypatch.setattr(calibrate, "_calibrate", wrapped)
    return calls


def test_cache_matches_fresh_calibration_and_computes_once(tmp_path, monkeypatch):
    monkeypatch.delenv(SIGMA_CACHE_ENV, raising=False)
    fresh = noise_multiplier_for(**ARGS)
    monkeypatch.setenv(SIGMA_CACHE_ENV, str(tmp_path))
    calls = _counting(monkeypatch)
    first, second = noise_multiplier_for(**ARGS), noise_multiplier_for(**ARGS)
    assert first == second == fresh
    assert len(calls) == 1
    assert len(list(tmp_path.glob("sigma-*.json"))) == 1


@pytest.mark.parametrize("change", [{"accountant": "prv"}, {"steps": 201}, {"target_epsilon": 3.0000001},
                                    {"delta": 2e-5}, {"sample_rate": 0.021}])
def test_every_argument_is_part_of_the_key(tmp_path, monkeypatch, change):
    monkeypatch.setenv(SIGMA_CACHE_ENV, str(tmp_path))
    calls = _counting(monkeypatch)
    noise_multiplier_for(**ARGS)
    noise_multiplier_for(**{**ARGS, **change})
    assert len(calls) == 2


def test_a_tampered_entry_is_recomputed(tmp_path, monkeypatch):
    monkeypatch.setenv(SIGMA_CACHE_ENV, str(tmp_path))
    good = noise_multiplier_for(**ARGS)
    (entry,) = tmp_path.glob("sigma-*.json")
    data = json.loads(entry.read_text())
    entry.write_text(json.dumps({**data, "key": {**data["key"], "steps": "999"}, "sigma": 0.5}))
    calls = _counting(monkeypatch)
    assert noise_multiplier_for(**ARGS) == good
    assert len(calls) == 1
    entry.write_text("not json")
    assert noise_multiplier_for(**ARGS) == good


def _hold(path, events, log, name, hold):
    from foundation.io import waiting_lock

    with waiting_lock(path):
        events.set()
        with open(log, "a") as fh:
            fh.write(f"{name}-in\n")
        time.sleep(hold)
        with open(log, "a") as fh:
            fh.write(f"{name}-out\n")


def test_waiting_lock_makes_a_second_process_wait(tmp_path):
    """The lock both on-disk caches use (σ here, the ViT arm's pre-trained weights): a process asking for a held
    lock waits for its release instead of entering beside the holder."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    lock, log, held = tmp_path / "x.lock", tmp_path / "log", ctx.Event()
    first = ctx.Process(target=_hold, args=(lock, held, log, "a", 1.0))
    first.start()
    assert held.wait(30)
    second = ctx.Process(target=_hold, args=(lock, ctx.Event(), log, "b", 0.0))
    second.start()
    first.join(30)
    second.join(30)
    assert log.read_text().split() == ["a-in", "a-out", "b-in", "b-out"]
