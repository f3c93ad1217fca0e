"""Hostile disks and memory: every command that writes, on a full disk, a read-only output directory and a failing
rename; TensorBoard's writer thread and a lock whose writes fail; an allocation that fails.

Issue 37: "no exit 0 after a failed write". Each case ends like every bad input (:func:`hostile_common.assert_error`:
exit 2, one line naming the file and what to do, no traceback) and leaves nothing half-written: no temporary file
and no lock left behind, the file whose write failed absent (or as it was), and a command that creates a run
directory (``audit train``, ``audit import``) leaves no directory that looks finished without its parts. The
faults are injected under the output directory only (tests/disk_faults.py): a full disk at *every* write of the
command in turn (the first k - 1 writes succeed), a read-only directory at the first file created, and a rename
that fails at the last write. ``audit import`` and ``audit canaries make`` write a unit (a run directory, a kit):
after a failure nothing of it is left (:func:`foundation.io.all_or_nothing`); ``audit train`` keeps its resumable
state and ``--resume`` finishes the run once the disk has room.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
import torch
from disk_faults import DiskFaults, leftovers
from hostile_common import ATTACK_ARGS, assert_error, cli, write_cfg
from hostile_runs_common import run_fixtures

from foundation.io import save_safetensors, sha256_file

base, run = run_fixtures()

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="fault injection reads /proc/self/fd")


def _train(tmp: Path, run: Path) -> tuple[list, Path]:
    return ["train", write_cfg(tmp / "cfg.yaml", tmp / "runs"), "--no-progress"], tmp / "runs"


def _attack(tmp: Path, run: Path) -> tuple[list, Path]:
    for name in ("attack.json", "scores.npz", "signals.npz"):  # made by the fixture: make them again
        (run / name).unlink()
    return ["attack", run, *ATTACK_ARGS], run


def _epsilon(tmp: Path, run: Path) -> tuple[list, Path]:
    return ["epsilon", run, "--sources", "pool", "--attack", "loss"], run


def _report(tmp: Path, run: Path) -> tuple[list, Path]:
    return ["report", run], run


def _gate(tmp: Path, run: Path) -> tuple[list, Path]:
    (tmp / "policy.yaml").write_text("rules:\n  - rule: max_claimed_epsilon\n    budget: 100\n")
    return ["gate", run, run, "--policy", tmp / "policy.yaml", "--out", tmp / "ci" / "gate.json"], tmp / "ci"


def _transfer(tmp: Path, run: Path) -> tuple[list, Path]:
    (tmp / "suite.yaml").write_text("name: t\ndevice: cpu\n"
                                    "datasets: [{name: digits, train_limit: 60, test_limit: 30}]\n"
                                    "protocols: {linear_probe: {c_grid: [1.0]}}\n")
    return ["transfer", run, "--suite", tmp / "suite.yaml", "--quiet"], run


def _canaries(tmp: Path, run: Path) -> tuple[list, Path]:
    return ["canaries", "make", "--num-classes", "10", "--image-size", "4", "--seed", "1", "--count", "20",
            "--out", tmp / "kit"], tmp / "kit"


def _import(tmp: Path, run: Path) -> tuple[list, Path]:
    from training.config import ModelConfig
    from training.models import build_model

    torch.manual_seed(0)
    net = build_model(ModelConfig(arch="mlp", kwargs={"hidden": [8]}), num_classes=10, input_shape=(3, 8, 8)).module
    save_safetensors(tmp / "w.safetensors", net.state_dict())
    return ["import", "--weights", tmp / "w.safetensors", "--arch", "mlp", "--kwargs", '{"hidden": [8]}', "--members",
            "digits:train", "--nonmembers", "digits:test", "--limit", "40", "--population", "10",
            "--claimed-epsilon", "3", "--delta", "1e-5", "--out", tmp / "imported"], tmp / "imported"


def _mechanism(tmp: Path, run: Path) -> tuple[list, Path]:
    return ["mechanism", "--sigma", "2", "--sample-rate", "1", "--steps", "4", "--delta", "1e-5", "--trials", "400",
            "--out", tmp / "mech"], tmp / "mech"


#: Commands whose output is one unit, absent after any failed write (the output directory is new here).
UNITS = ("import", "canaries make")
COMMANDS = {"train": _train, "attack": _attack, "epsilon": _epsilon, "report": _report, "gate": _gate,
            "transfer": _transfer, "canaries make": _canaries, "import": _import, "mechanism": _mechanism}


def _snapshot(root: Path) -> dict[Path, str]:
    return {p: sha256_file(p) for p in root.rglob("*") if p.is_file()} if root.exists() else {}


def _check(result, faults: DiskFaults, root: Path, before: dict[Path, str], pattern: str, name: str) -> None:
    """One line, exit 2, nothing half-written (module notes)."""
    assert faults.failed is not None, f"no write under {root} failed: {faults.targets}"
    line = assert_error(result, pattern)
    assert str(faults.failed.name) in line, line
    assert leftovers(root) == [], leftovers(root)
    written = faults.targets[:faults.at - 1]  # the writes that succeeded before the disk failed
    if faults.failed in written:  # an earlier complete version of the same file is kept
        pass
    elif faults.failed in before:
        assert sha256_file(faults.failed) == before[faults.failed], f"{faults.failed} is neither old nor new"
    else:
        assert not faults.failed.exists(), f"{faults.failed} was written although its write failed"
    for made in root.rglob("manifest.json") if root.exists() else ():  # a run directory that looks finished
        if made not in before:
            raise AssertionError(f"{made} written although the command failed: the run looks complete")
    if name in UNITS:
        assert not root.exists(), f"{name} left part of its output: {sorted(root.rglob('*'))}"


def _prepare(name: str, work: Path, run: Path) -> tuple[list, Path]:
    """The command's arguments and output directory, on a fresh copy of the tiny run under ``work``."""
    work.mkdir()
    copy = work / "run"
    shutil.copytree(run, copy)
    args, root = COMMANDS[name](work, copy)
    return args, Path(root)


def _writes(monkeypatch, name: str, work: Path, run: Path, stage: str) -> int:
    """How many ``stage`` operations the command makes under its output directory (a clean run, counted)."""
    args, root = _prepare(name, work, run)
    with monkeypatch.context() as m:
        faults = DiskFaults(m, root, stage=stage, code=errno.ENOSPC, at=None)
        res = cli(*args)
    assert res.exit_code == 0, res.output
    return len(faults.targets)


def _check_faulted(monkeypatch, name: str, work: Path, run: Path, *, stage: str, code: int, at: int,
             pattern: str) -> list:
    """Run the command with the fault, check the outcome (:func:`_check`); return its arguments."""
    args, root = _prepare(name, work, run)
    before = _snapshot(root)
    with monkeypatch.context() as m:
        faults = DiskFaults(m, root, stage=stage, code=code, at=at)
        res = cli(*args)
    _check(res, faults, root, before, pattern, name)
    return args


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_full_disk_at_every_write_is_one_line_and_leaves_nothing_half_written(run, tmp_path, monkeypatch, name):
    n = _writes(monkeypatch, name, tmp_path / "count", run, "write")
    assert n >= 1
    for k in range(1, n + 1):
        args = _check_faulted(monkeypatch, name, tmp_path / f"k{k}", run, stage="write", code=errno.ENOSPC, at=k,
                        pattern=r"no space left on device writing .*; free disk space")
    if name == "train":  # the disk failed at the manifest, the last write: space freed, --resume finishes the run
        done = cli(*args, "--resume")
        assert done.exit_code == 0 and (tmp_path / f"k{n}" / "runs" / "tiny" / "manifest.json").is_file(), done.output


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES], ids=["read-only-fs", "permission"])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_read_only_output_directory_is_one_line(run, tmp_path, monkeypatch, name, code):
    _check_faulted(monkeypatch, name, tmp_path / "w", run, stage="create", code=code, at=1,
             pattern=r"permission denied on .*; choose a writable output directory")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_rename_that_fails_is_one_line(run, tmp_path, monkeypatch, name):
    n = _writes(monkeypatch, name, tmp_path / "count", run, "rename")
    _check_faulted(monkeypatch, name, tmp_path / "w", run, stage="rename", code=errno.EIO, at=n,
             pattern=r"Input/output error on .*; check the disk")


@pytest.mark.parametrize("name", ["train", "epsilon"])
def test_a_file_too_large_is_one_line(run, tmp_path, monkeypatch, name):
    """EFBIG (a file over the file system's size limit) at the first write: a traceback before issue 37."""
    _check_faulted(monkeypatch, name, tmp_path / "w", run, stage="write", code=errno.EFBIG, at=1,
             pattern=r"file too large writing .*; choose an output_dir on a file system that allows larger files")


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # pytest's own excepthook
def test_a_full_disk_under_the_tensorboard_writer_is_one_line(tmp_path, monkeypatch, capfd):
    """TensorBoard writes its events from a background thread (no fsync, so not caught above): a full disk there
    used to print that thread's traceback beside the one-line error."""
    import threading

    import tensorboard.summary.writer.record_writer as record_writer

    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "runs" / "tiny" / "tb" / "events"))

    monkeypatch.setattr(record_writer.RecordWriter, "write", full)
    res = cli("train", write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs"), "--no-progress")
    for thread in threading.enumerate():  # let TensorBoard's writer thread finish dying
        if type(thread).__module__.startswith("tensorboard."):
            thread.join(10)
    assert_error(res, r"no space left on device writing .*events; free disk space")
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "Exception in thread" not in out + err, err
    assert not (tmp_path / "runs" / "tiny" / "manifest.json").exists()


def test_a_lock_whose_write_fails_is_not_left_behind(run, monkeypatch):
    """A full disk while writing the run lock itself (no fsync there): one line, and no half-written ``.lock``
    left to confuse the next writer."""
    import json
    import types

    from foundation import lock

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(run / lock.LOCK_FILE))

    monkeypatch.setattr(lock, "json", types.SimpleNamespace(**{k: getattr(json, k) for k in ("loads", "dumps")},
                                                            JSONDecodeError=json.JSONDecodeError, dump=full))
    assert_error(cli("epsilon", run, "--sources", "pool", "--attack", "loss"),
                 r"no space left on device writing .*\.lock")
    assert leftovers(run) == [] and not (run / "epsilon.json").exists()


@pytest.mark.parametrize("failure", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
                 "to allocate 10000000000000 bytes. Error code 12 (Cannot allocate memory)"),
    RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    MemoryError(),
], ids=["torch-cpu", "torch-cuda", "python"])
def test_an_allocation_that_fails_is_one_line(tmp_path, monkeypatch, failure):
    """torch reports a failed allocation as a RuntimeError (a traceback before issue 37): one line, exit 2."""
    def allocate(*_a, **_k):
        raise failure

    monkeypatch.setattr("training.trainer.train", allocate)
    assert_error(cli("train", write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs"), "--no-progress"),
                 r"out of memory; lower data\.image_size")
    assert not (tmp_path / "runs" / "tiny" / "manifest.json").exists()


def test_other_runtime_errors_are_not_called_out_of_memory(tmp_path, monkeypatch):
    def bug(*_a, **_k):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)")

    monkeypatch.setattr("training.trainer.train", bug)
    r = cli("train", write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs"), "--no-progress")
    assert r.exit_code == 1 and isinstance(r.exception, RuntimeError) and "out of memory" not in r.output
