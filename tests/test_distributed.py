"""Multi-process DP training (issue 13, item 2): 2 gloo ranks on CPU.

- One logical step split over 2 ranks: the clipped-gradient sum equals the 1-rank sum and a per-example loop
  (the obviously correct reference); the noise is one draw of std σ·C (the 1-rank draw itself), not √2·σ·C;
  both ranks end with the same parameters.
- ``audit train --nproc 2`` (torchrun): the manifest's (σ, q, T, ε) equal the 1-process run's and the weights
  agree; only rank 0 wrote the run directory.
- kill -9 of rank 1 mid-run: without ``--resume`` the run is refused in one line (exit 2); with it the run
  completes with the uninterrupted run's ε and weights.
- Network and provenance (issue 31): every socket the ``--nproc 2`` run's processes listen on (the launcher's
  rendezvous store, the ranks' gloo pairs), sampled from /proc while it runs, is on loopback; its
  ``provenance.command`` is the user's command with ``--nproc 2``, and ``provenance.threads`` the ranks' share.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import yaml
from torch import nn

from training.config import OptimConfig, TrainConfig
from training.distributed import SINGLE, World, launch_command, world_from_env
from training.dp.engine import make_stepper
from training.dp.sampling import ShardedSampler, make_sampler
from foundation.errors import UserError
from training.dp.recipe import TrainRecipe
from foundation.files import MANIFEST_FILE, STATE_FILE
from training.threads import PARALLEL_WORK

pytestmark = pytest.mark.slow  # starts processes (torch.multiprocessing spawn, torchrun)

ROOT = Path(__file__).resolve().parents[1]
SIGMA, C, B = 1.3, 0.5, 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(B, 3, 4, 4, generator=g) * 2, torch.randint(0, 3, (B,), generator=g)


def _model(kind: str) -> nn.Module:
    torch.manual_seed(1)
    if kind == "sum":
        return nn.Sequential(nn.Flatten(), nn.Linear(48, 3))
    return nn.Sequential(nn.Flatten(), nn.Linear(48, 400, bias=False))  # zero inputs: zero gradients, pure noise


def test_shards_and_worlds_refuse_what_would_split_batches_wrongly() -> None:
    with pytest.raises(ValueError, match="seeded sampler"):
        ShardedSampler(make_sampler(sampling="poisson", n=10, batch_size=2, seed=None), rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\)"):
        ShardedSampler(make_sampler(sampling="shuffle", n=10, batch_size=4, seed=0), rank=2, world_size=2)
    shuffle = make_sampler(sampling="shuffle", n=10, batch_size=4, seed=0)
    shares = [ShardedSampler(shuffle, rank=r, world_size=3).indices(1) for r in range(3)]
    assert sorted(i for s in shares for i in s.tolist()) == sorted(shuffle.indices(1).tolist())
    with pytest.raises(UserError, match="RANK must be in"):
        world_from_env({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(UserError, match="must be integers"):
        world_from_env({"RANK": "x", "WORLD_SIZE": "2"})
    assert world_from_env({}) == SINGLE


def _one_step(kind: str, world: World) -> torch.Tensor:
    """The parameter change of one DP-SGD step (SGD, lr 1) on this rank's share of the batch."""
    model = _model(kind)
    x, y = _batch()
    if kind == "noise":
        x = torch.zeros_like(x)
    recipe = TrainRecipe(steps=1, batch_size=B, optim=OptimConfig(name="sgd", lr=1.0, momentum=0.0),
                         noise_multiplier=SIGMA, max_grad_norm=C, physical_batch_size=4)
    stepper = make_stepper(model=model, recipe=recipe, sample_rate=0.5, generator=torch.Generator().manual_seed(7),
                           device="cpu", world=world, _debug_disable_noise=kind == "sum")
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    stats = stepper.step(x[world.rank::world.size], y[world.rank::world.size])
    assert stats.batch_size == B  # the logical batch's size, summed over the ranks
    after = torch.cat([p.detach().flatten() for p in stepper.close().parameters()])
    return after - before


def _rank(rank: int, world_size: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world_size)
    try:
        for kind in ("sum", "noise"):
            torch.save(_one_step(kind, World(rank=rank, size=world_size)), Path(out) / f"{kind}-{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict[str, list[torch.Tensor]]:
    """kind -> the parameter change on rank 0 and rank 1 (one spawn of 2 gloo ranks for both kinds)."""
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(_rank, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    return {k: [torch.load(out / f"{k}-{r}.pt", weights_only=True) for r in range(2)] for k in ("sum", "noise")}


def _clipped_sum_by_loop() -> torch.Tensor:
    """Σ_i clip_C(∇ℓ_i), one backward per example (the obviously correct reference)."""
    model = _model("sum")
    x, y = _batch()
    total = None
    for i in range(B):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        g = torch.cat([p.grad.flatten() for p in model.parameters()])
        g = g * min(1.0, C / (float(g.norm()) + 1e-6))
        total = g if total is None else total + g
    return total


def test_two_ranks_sum_the_one_rank_clipped_gradients(two_ranks) -> None:
    ranks = two_ranks["sum"]
    one = _one_step("sum", SINGLE)
    assert torch.equal(ranks[0], ranks[1])                       # the ranks stay in step
    torch.testing.assert_close(ranks[0], one, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(-one * B, _clipped_sum_by_loop(), rtol=1e-4, atol=1e-6)
    assert float(one.abs().max()) > 1e-3                         # not a vacuous comparison


def test_two_ranks_add_the_noise_once(two_ranks) -> None:
    ranks = two_ranks["noise"]
    one = _one_step("noise", SINGLE)
    assert torch.equal(ranks[0], ranks[1])
    torch.testing.assert_close(ranks[0], one, rtol=1e-6, atol=1e-7)  # rank 0's draw is the 1-rank draw
    std = float((ranks[0] * B / C).std())                        # 19,200 coordinates of N(0, σ²)
    assert abs(std / SIGMA - 1) < 0.03, std                      # √2·σ (noise on every rank) would be 1.84


# ----------------------------------------------------------------------------------------------- torchrun

STEPS = 200


def _config(out: Path, name: str) -> Path:
    cfg = {"name": name, "output_dir": str(out),
           "data": {"dataset": "synthetic", "split": "train:n=96,classes=4,noise=250",
                    "test_split": "test:n=40,classes=4,noise=250"},
           "privacy": {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1e-3},
           "optim": {"name": "sgd", "lr": 0.05}, "training": {"steps": STEPS, "batch_size": 16, "progress": False,
                                                              "log_every": 50, "checkpoint_every": 10}}
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _audit_train(config: Path, *extra: str) -> subprocess.CompletedProcess:
    """``audit train CONFIG --nproc 2 ...`` (which runs torchrun)."""
    return subprocess.run([sys.executable, "-m", "audit", "train", str(config), "--nproc", "2", "--no-progress",
                           *extra], env=_env(), capture_output=True, text=True, timeout=600)


def _tree(root: int) -> set[int]:
    """``root`` and its descendants now."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def _address(hex_addr: str) -> str:
    """An address of /proc/net/tcp{,6} (little-endian 32-bit words) as text."""
    import ipaddress

    raw = bytes.fromhex(hex_addr)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(raw))


def listening(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that one of ``pids`` holds open."""
    found: set[tuple[str, int]] = set()
    for pid in pids:
        try:
            inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
                      if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
            tables = [Path(f"/proc/{pid}/net/{t}").read_text().splitlines()[1:] for t in ("tcp", "tcp6")]
        except OSError:  # the process ended meanwhile
            continue
        for row in (r.split() for table in tables for r in table):
            if row[3] == "0A" and row[9] in inodes:  # st 0A: LISTEN
                addr, port = row[1].rsplit(":", 1)
                found.add((_address(addr), int(port, 16)))
    return found


def _is_loopback(address: str) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def _watched_train(config: Path) -> tuple[int, str, str, set[tuple[str, int]]]:
    """``audit train CONFIG --nproc 2`` with the listening sockets of its process tree sampled until it ends."""
    env = {k: v for k, v in _env().items() if k not in ("OMP_NUM_THREADS", "DP_AUDIT_THREADS")}  # policy decides
    proc = subprocess.Popen([sys.executable, "-m", "audit", "train", str(config), "--nproc", "2", "--no-progress"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= listening(_tree(proc.pid))
        time.sleep(0.05)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err, seen


def _privacy(run: Path) -> tuple:
    p = json.loads((run / MANIFEST_FILE).read_text())["privacy"]
    return p["epsilon"], p["delta"], [(f["noise_multiplier"], f["sample_rate"], f["steps"]) for f in p["phases"]]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run / "model.safetensors")


@pytest.fixture(scope="module")
def watched_run(tmp_path_factory) -> tuple[Path, set[tuple[str, int]]]:
    """The ``--nproc 2`` run directory and the sockets its processes listened on."""
    out = tmp_path_factory.mktemp("ddp")
    code, stdout, stderr, seen = _watched_train(_config(out, "two"))
    assert code == 0, stdout + stderr
    assert stdout.count("done:") == 1  # rank 0 alone reports
    return out / "two", seen


@pytest.fixture(scope="module")
def two_rank_run(watched_run) -> Path:
    return watched_run[0]


def test_the_nproc_run_listens_on_loopback_only(watched_run) -> None:
    _, seen = watched_run
    assert len(seen) >= 2, seen  # the rendezvous store and the ranks' gloo listeners were seen (not vacuous)
    assert all(_is_loopback(address) for address, _ in seen), sorted(seen)
    assert not _is_loopback("0.0.0.0") and not _is_loopback("::") and _is_loopback("::ffff:127.0.0.1")
    assert _address("0100007F") == "127.0.0.1" and _address("00000000") == "0.0.0.0"


def test_the_nproc_run_records_the_users_command_and_the_ranks_threads(two_rank_run: Path) -> None:
    provenance = json.loads((two_rank_run / MANIFEST_FILE).read_text())["provenance"]
    assert provenance["command"] == f"audit train {two_rank_run.parent / 'two.yaml'} --nproc 2 --no-progress"
    threads = provenance["threads"]
    assert threads["role"] == "rank" and threads["processes"] == 2
    assert threads["threads"] == 1 and "environment" not in threads["reason"]  # the launcher's OMP_NUM_THREADS=1
    assert threads["work"] < PARALLEL_WORK or "shared by 2 processes" in threads["reason"]  # is not the user's


def test_torchrun_run_claims_what_one_process_claims(two_rank_run: Path, tmp_path: Path) -> None:
    from training.trainer import train

    one = train(TrainConfig.model_validate(yaml.safe_load(_config(tmp_path, "one").read_text())),
                progress=False).run_dir
    assert _privacy(two_rank_run) == _privacy(one)
    a, b = _weights(two_rank_run), _weights(one)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4
    manifest = json.loads((two_rank_run / MANIFEST_FILE).read_text())
    assert manifest["training"]["distributed"]["processes"] == 2
    assert len(list((two_rank_run / "tb").iterdir())) == 1  # one writer of TensorBoard events
    assert not (two_rank_run / STATE_FILE).exists() and not (two_rank_run / ".lock").exists()


def _pid_of_rank(agent: int, rank: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = b"\0" + (entry / "environ").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == agent and f"\0RANK={rank}\0".encode() in env:
            return int(entry.name)
    return None


def test_kill_one_rank_then_resume_ends_like_the_uninterrupted_run(two_rank_run: Path, tmp_path: Path) -> None:
    config = _config(tmp_path, "killed")
    run = tmp_path / "killed"
    agent = subprocess.Popen(launch_command(["train", str(config), "--no-progress"], nproc=2), env=_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not (run / STATE_FILE).exists():  # the first checkpoint: training is under way
        assert agent.poll() is None and time.monotonic() < deadline, "the run ended before a rank could be killed"
        time.sleep(0.01)
    victim = _pid_of_rank(agent.pid, rank=1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    agent.communicate(timeout=300)
    assert agent.returncode != 0
    assert not (run / MANIFEST_FILE).exists() and (run / STATE_FILE).exists()  # interrupted, state kept
    stopped_at = torch.load(run / STATE_FILE, weights_only=True)["step"]
    assert 0 < stopped_at < STEPS

    refused = _audit_train(config)  # without --resume: rank 0 refuses for every rank, in one line
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.count("error:") == 1 and "pass --resume" in refused.stderr
    assert "Traceback" not in refused.stderr + refused.stdout

    res = _audit_train(config, "--resume")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "resumed at step" in res.stdout
    assert _privacy(run) == _privacy(two_rank_run)
    a, b = _weights(run), _weights(two_rank_run)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6


def test_a_multi_node_launch_without_an_endpoint_is_refused_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from audit.cli import main

    config = _config(tmp_path, "nodes")
    for extra, message in ((["--nnodes", "2"], "nnodes=2 needs an endpoint HOST:PORT"),
                           (["--rdzv-endpoint", "node0"], "endpoint must be HOST:PORT")):
        res = CliRunner().invoke(main, ["train", str(config), "--nproc", "2", *extra])
        assert res.exit_code == 2, res.output
        assert message in res.output and "--rdzv-endpoint node0:29400" in res.output
        assert not (tmp_path / "nodes").exists()  # refused before anything was launched or written
