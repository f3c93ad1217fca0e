"""The ``ray`` executor is isolated, fails fast and stays on loopback (issue 31, the Ray half).

- a closed port, an HTTP server and a silent TCP listener named as the cluster fail within seconds with one
  line naming the address and the cause, before Ray is asked to join them; so does ``auto`` reading a stale
  address file; ``--retrain-shadows`` towards such an address leaves the run's reference models untouched;
- Ray's error messages are shortened to one line without tracebacks, and the recorded address has no secrets;
- (slow) with a stale ``ray_current_cluster`` file and ``RAY_ADDRESS`` pointing nowhere, and with a live foreign
  ``ray start --head`` on this machine, the default executor starts its own Ray (its own resources and GCS),
  every socket its processes listen on is a loopback address, it gives the batched executor's weights, and it
  leaves no process behind; the foreign cluster still runs, and an explicit address reaches it with the token
  found on this machine (no ``RAY_AUTH_MODE`` needed), or says in one line how to provide a missing one.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from attacks.ray_connect import _why, redact_address
from attacks.ray_farm import RayOptions, ray_session
from attacks.shadows import prepare_shadows
from foundation.errors import UserError
from training.config import TrainConfig
from training.run import open_run

ray = pytest.importorskip("ray")

CONTRACT_S = 30.0  # the bound on failing; not a benchmark


def _config(output_dir: Path) -> TrainConfig:
    return TrainConfig.model_validate({
        "name": "target", "output_dir": str(output_dir),
        "data": {"dataset": "synthetic", "split": "train:n=64,classes=4,noise=250",
                 "test_split": "test:n=32,classes=4,noise=250"},
        "privacy": {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1e-3},
        "optim": {"name": "sgd", "lr": 0.2},
        "training": {"steps": 6, "batch_size": 16, "progress": False, "log_every": 100}})


def _target(tmp_path: Path) -> Path:
    from training.trainer import train

    return train(_config(tmp_path), progress=False).run_dir


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def _fails_fast(address: str) -> str:
    t0 = time.monotonic()
    with pytest.raises(UserError) as info:
        with ray_session(RayOptions(address=address)):
            pass
    assert time.monotonic() - t0 < CONTRACT_S
    assert not ray.is_initialized()
    message = str(info.value)
    assert "\n" not in message and redact_address(address) in message
    return message


@pytest.fixture
def http_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_closed_port_http_server_and_silent_listener_fail_fast_in_one_line(http_port) -> None:
    port = _closed_port()
    assert "nothing is listening" in _fails_fast(f"127.0.0.1:{port}")
    assert "nothing is listening" in _fails_fast(f"ray://127.0.0.1:{port}")
    assert "speaks HTTP/1" in _fails_fast(f"127.0.0.1:{http_port}")
    assert "speaks HTTP/1" in _fails_fast(f"ray://127.0.0.1:{http_port}")
    with socket.socket() as silent:  # accepts (the kernel's backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        assert "no gRPC answer" in _fails_fast(f"127.0.0.1:{silent.getsockname()[1]}")


def test_auto_with_a_stale_address_file_names_the_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    stale = tmp_path / "ray" / "ray_current_cluster"
    stale.write_text(f"127.0.0.1:{_closed_port()}")
    t0 = time.monotonic()
    with pytest.raises(UserError, match="nothing is listening at auto") as info:
        with ray_session(RayOptions(address="auto")):
            pass
    assert time.monotonic() - t0 < CONTRACT_S and str(stale) in str(info.value) and "ray stop" in str(info.value)


def test_retrain_shadows_towards_an_unreachable_cluster_keeps_the_shadows(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from audit.cli import main

    run = _target(tmp_path)
    prepare_shadows(target=open_run(run), n_models=2, seed=0, executor="batched", device="cpu")
    before = {p.relative_to(run): p.read_bytes() for p in sorted((run / "shadows").rglob("*")) if p.is_file()}
    assert len(before) > 4
    address = f"127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    res = CliRunner().invoke(main, ["attack", str(run), "--ray-address", address, "--retrain-shadows",
                                    "--set", "attack.n_reference=2", "--no-progress"])
    assert time.monotonic() - t0 < CONTRACT_S
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert address in res.output and "nothing is listening" in res.output
    after = {p.relative_to(run): p.read_bytes() for p in sorted((run / "shadows").rglob("*")) if p.is_file()}
    assert after == before
    assert not (run / "attack.json").exists()


def test_ray_errors_become_one_line_with_the_cause_and_the_fix() -> None:
    try:
        try:
            raise RuntimeError("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    g()\n"
                               "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication "
                               "token is missing or incorrect. Note: RAY_AUTH_MODE is currently 'disabled'")
        except RuntimeError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379") from inner
    except ConnectionError as exc:
        auth = _why(exc, "10.0.0.5:6379", token=False)
    assert "\n" not in auth and "Traceback" not in auth and "x.py" not in auth
    assert "requires token authentication and no token was found here" in auth
    assert "InvalidAuthToken: Authentication token is missing or incorrect" in auth
    assert "RAY_AUTH_MODE=token" in auth and "~/.ray/auth_token" in auth
    version = _why(RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.9.0\n    Python: "
                                "3.10.1\nThis process on node 10.0.0.7 was started with:\n    Ray: 2.60.0\n"),
                   "10.0.0.5:6379", token=True)
    assert "runs another Ray or Python version" in version and "Ray: 2.9.0" in version and "\n" not in version
    server = _why(ConnectionError("Initialization failure from server:\nTraceback (most recent call last):\n  "
                                  "File \"server.py\", line 3\n    boom()\nValueError: no module named 'foo' on "
                                  "the head node"), "ray://head:10001", token=False)
    assert server.endswith("Initialization failure from server: ValueError: no module named 'foo' on the head "
                           "node")
    assert redact_address("ray://bob:pw@head:10001?token=t") == "ray://head:10001"
    with pytest.raises(ValueError, match="bind_host applies to a local Ray only"):
        RayOptions(address="auto", bind_host="10.0.0.5")
    with pytest.raises(ValueError, match="ray_bind_host must be"):
        RayOptions(bind_host="0.0.0.0")


# ---- slow: real Ray processes ---------------------------------------------------------------------------------

def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _listening() -> dict[str, tuple[str, int]]:
    """socket inode -> (address, port) of every listening TCP socket on this machine (``/proc/net/tcp{,6}``)."""
    out = {}
    for family, path in ((socket.AF_INET, "/proc/net/tcp"), (socket.AF_INET6, "/proc/net/tcp6")):
        if not os.path.exists(path):
            continue
        with open(path) as fh:
            rows = fh.read().splitlines()[1:]
        for row in rows:
            fields = row.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = b"".join(struct.pack("<I", int(hex_ip[i:i + 8], 16)) for i in range(0, len(hex_ip), 8))
            out[fields[9]] = (socket.inet_ntop(family, raw), int(hex_port, 16))
    return out


def _listeners_of(pids: list[int]) -> list[tuple[int, str, int]]:
    sockets = _listening()
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in sockets:
                found.append((pid, *sockets[link[8:-1]]))
    return found


def _is_loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1") or ip.startswith("::ffff:127.")


def _pids_mentioning(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if text.encode() in fh.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def _kill(pids: list[int], *, wait: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") and _alive(p) for p in pids):
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _weights(shadows) -> list[dict[str, torch.Tensor]]:
    return [run.state_dict for run in shadows.runs]


def _max_diff(a, b) -> float:
    return max(float((x[n].double() - y[n].double()).abs().max()) for x, y in zip(a, b) for n in x)


def _reference_models(tmp_path: Path) -> tuple[Path, object]:
    """A target and its 2 reference models trained batched in a copy (the weights Ray must give)."""
    run = _target(tmp_path / "t")
    batched = shutil.copytree(run, tmp_path / "batched")
    return run, prepare_shadows(target=open_run(batched), n_models=2, seed=3, executor="batched", device="cpu")


def _worker_env(monkeypatch) -> None:
    """The workers of a local Ray import this checkout (they inherit the driver's environment)."""
    root = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.slow
def test_a_stale_cluster_file_is_ignored_and_the_local_ray_listens_on_loopback_only(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    if ray.is_initialized():
        pytest.skip("another Ray is already running in this process")
    _worker_env(monkeypatch)
    stale_port = _closed_port()
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths live under it
    try:
        (temp / "ray").mkdir()
        (temp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{stale_port}")
        monkeypatch.setenv("RAY_TMPDIR", str(temp))
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{stale_port}")  # a stale shell variable too
        run, batched = _reference_models(tmp_path)
        with ray_session(RayOptions(local_cpus=1)) as session:
            gcs = ray.get_runtime_context().gcs_address
            session_dir = ray._private.worker._global_node.get_session_dir_path()
            assert session.slots == 1 and session.where == "local (127.0.0.1)"
            assert gcs.startswith("127.0.0.1:") and not gcs.endswith(f":{stale_port}")
            assert not session_dir.startswith(str(temp))  # a temp dir of its own, not Ray's shared one
            farm = prepare_shadows(target=open_run(run), n_models=2, seed=3, executor="ray", device="cpu")
            pids = _tree(os.getpid()) + _pids_mentioning(session_dir)
            listeners = _listeners_of(sorted(set(pids)))
        ports = {port for _, _, port in listeners}
        assert int(gcs.rsplit(":", 1)[1]) in ports and len(listeners) >= 3  # the GCS, the raylet, workers...
        assert [x for x in listeners if not _is_loopback(x[1])] == []
        assert farm.trained == 2 and farm.index["ray_address"] == "local (127.0.0.1)"
        assert (farm.keep == batched.keep).all() and _max_diff(_weights(farm), _weights(batched)) < 1e-6
        assert not ray.is_initialized() and not Path(session_dir).exists()
        deadline = time.monotonic() + 15
        while _pids_mentioning(session_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _pids_mentioning(session_dir) == []  # no Ray process left behind
        assert (temp / "ray" / "ray_current_cluster").read_text() == f"127.0.0.1:{stale_port}"  # left alone
    finally:
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def foreign_cluster():
    """A ``ray start --head`` on 127.0.0.1 with 3 CPUs and token auth, as another user of the machine would
    leave it (its address file in its temp dir); its processes are killed at the end (``ray stop`` would
    stop every Ray of the machine)."""
    temp = tempfile.mkdtemp(prefix="rf", dir="/tmp")
    port = _closed_port()
    env = {**os.environ, "RAY_TMPDIR": temp, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    ray_cli = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
    try:
        subprocess.run([*ray_cli, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                        "--num-cpus=3", "--include-dashboard=false", f"--temp-dir={temp}/ray",
                        "--disable-usage-stats"], env=env, check=True, timeout=120, capture_output=True)
        yield temp, f"127.0.0.1:{port}"
    finally:
        _kill(_pids_mentioning(temp))
        shutil.rmtree(temp, ignore_errors=True)


_JOIN = """
import sys, time
from attacks.ray_farm import RayOptions, ray_session
from foundation.errors import UserError
t0 = time.monotonic()
try:
    with ray_session(RayOptions(address=sys.argv[1])) as session:
        import ray
        print("cpus", int(ray.cluster_resources()["CPU"]), session.where)
except UserError as exc:
    print("error", round(time.monotonic() - t0, 1), exc)
"""


def _join_in_a_new_process(address: str, *, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", _JOIN, address], env=env, capture_output=True, text=True,
                          timeout=120)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    return lines[-1]


@pytest.mark.slow
def test_a_live_foreign_cluster_is_left_alone_unless_named(foreign_cluster, tmp_path: Path, monkeypatch) -> None:
    if ray.is_initialized():
        pytest.skip("another Ray is already running in this process")
    temp, address = foreign_cluster
    _worker_env(monkeypatch)
    monkeypatch.setenv("RAY_TMPDIR", temp)  # its ray_current_cluster is live
    monkeypatch.setenv("RAY_ADDRESS", address)
    assert Path(temp, "ray", "ray_current_cluster").read_text().strip() == address
    run, batched = _reference_models(tmp_path)
    with ray_session(RayOptions(local_cpus=1)) as session:
        assert ray.cluster_resources().get("CPU") == 1 and session.slots == 1  # not the foreign 3
        assert ray.get_runtime_context().gcs_address != address
        farm = prepare_shadows(target=open_run(run), n_models=2, seed=3, executor="ray", device="cpu")
    assert farm.index["ray_address"] == "local (127.0.0.1)"
    assert _max_diff(_weights(farm), _weights(batched)) < 1e-6
    assert not ray.is_initialized()
    # the foreign cluster still runs, and reaching it takes naming it
    monkeypatch.delenv("RAY_ADDRESS")
    with ray_session(RayOptions(address=address)) as session:
        assert ray.cluster_resources().get("CPU") == 3 and session.where == address
    assert not ray.is_initialized()
    # a fresh process without RAY_AUTH_MODE: the token in ~/.ray is sent to an explicit address as to auto; with
    # no token anywhere, one line says how to provide it
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    joined = _join_in_a_new_process(address, env=clean)
    assert joined == f"cpus 3 {address}"
    refused = _join_in_a_new_process(address, env={**clean, "HOME": str(tmp_path / "home")})
    assert refused.startswith("error ") and float(refused.split()[1]) < CONTRACT_S
    assert "requires token authentication and no token was found here" in refused
    assert "RAY_AUTH_MODE=token" in refused and "~/.ray/auth_token" in refused
    index = json.loads((run / "shadows" / "index.json").read_text())
    assert index["ray_address"] == "local (127.0.0.1)" and np.isfinite(index["train_seconds"])
