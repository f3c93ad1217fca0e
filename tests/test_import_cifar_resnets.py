"""External CIFAR ResNets import the way users name them: resnet{20,32,44,56,110}_cifar, depth, clear mismatches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from audit.cli import main
from audit.importer import import_checkpoint, parse_source
from training.config import ModelConfig
from foundation.errors import CheckpointError, ConfigError
from training.models import build_model
from training.models.cifar_resnet import CIFAR_RESNET_DEPTHS, CifarResNet, resnet32
from training.run.manifest import read_manifest

MEMBERS = parse_source("digits:train", limit=12)
NONMEMBERS = parse_source("digits:test", limit=12)


def _count(depth: int) -> int:
    """Parameters of He et al.'s CIFAR ResNet, counted from its layers (3 stages, option A, 10 classes)."""
    n, total = (depth - 2) // 6, 3 * 9 * 16 + 2 * 16 + 64 * 10 + 10
    for c_in, c in ((16, 16), (16, 32), (32, 64)):
        total += (c_in * 9 * c + 2 * c) + (c * 9 * c + 2 * c) + (n - 1) * 2 * (c * 9 * c + 2 * c)
    return total


@pytest.mark.parametrize("depth", CIFAR_RESNET_DEPTHS)
def test_every_depth_by_name_and_by_depth(depth) -> None:
    by_name = build_model(ModelConfig(arch=f"resnet{depth}_cifar", fix_batchnorm=False), num_classes=10,
                          input_shape=(3, 8, 8)).module.net
    by_depth = build_model(ModelConfig(arch="resnet_cifar", kwargs={"depth": depth}, fix_batchnorm=False),
                           num_classes=10, input_shape=(3, 8, 8)).module.net
    same = build_model(ModelConfig(arch=f"resnet{depth}_cifar", kwargs={"depth": depth}, fix_batchnorm=False),
                       num_classes=10, input_shape=(3, 8, 8)).module.net
    assert isinstance(by_name, CifarResNet) and by_name.depth == by_depth.depth == same.depth == depth
    assert sum(p.numel() for p in by_name.parameters()) == _count(depth)
    assert depth != 20 or _count(20) == 269722     # ResNet-20: 0.27M parameters (He et al., Table 6)


def test_import_path_factories_exist_for_every_depth() -> None:
    from training.models import cifar_resnet

    for depth in CIFAR_RESNET_DEPTHS:
        assert getattr(cifar_resnet, f"resnet{depth}")().depth == depth


def test_wrong_depth_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="resnet20_cifar"):
        build_model(ModelConfig(arch="resnet32_cifar", kwargs={"depth": 20}), num_classes=10, input_shape=(3, 8, 8))
    with pytest.raises(ConfigError, match=r"6n \+ 2.*got 21"):
        build_model(ModelConfig(arch="resnet_cifar", kwargs={"depth": 21}), num_classes=10, input_shape=(3, 8, 8))
    with pytest.raises(ConfigError, match='"depth": 110'):
        build_model(ModelConfig(arch="resnet_cifar"), num_classes=10, input_shape=(3, 8, 8))


@pytest.fixture(scope="module")
def resnet32_file(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ext") / "resnet32.th"
    torch.save({"state_dict": {f"module.{k}": v for k, v in resnet32().state_dict().items()}}, path)
    return path


def test_import_under_the_wrong_depth_names_the_detected_depth(resnet32_file: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"32-layer CIFAR ResNet.*--arch resnet20_cifar builds 20 layers: "
                                              r"use --arch resnet32_cifar"):
        import_checkpoint(weights=resnet32_file, arch="resnet20_cifar", members=MEMBERS, nonmembers=NONMEMBERS,
                          out=tmp_path / "a", device="cpu")
    assert not (tmp_path / "a").exists()
    with pytest.raises(CheckpointError, match="model.arch resnet32_cifar"):
        build_model(ModelConfig(arch="resnet56_cifar", pretrained=str(resnet32_file), fix_batchnorm=False),
                    num_classes=10, input_shape=(3, 8, 8))


@pytest.mark.parametrize("arch,kwargs", [("resnet32_cifar", {}), ("resnet_cifar", {"depth": 32}),
                                         ("resnet20_cifar", {"blocks_per_stage": 5})])
def test_the_manifest_names_the_real_architecture(resnet32_file: Path, tmp_path: Path, arch, kwargs) -> None:
    import_checkpoint(weights=resnet32_file, arch=arch, kwargs=kwargs, members=MEMBERS, nonmembers=NONMEMBERS,
                      out=tmp_path / "run", device="cpu")
    model = read_manifest(tmp_path / "run").model
    assert (model.arch, dict(model.kwargs)) == ("resnet32_cifar", {})


def test_cli_accepts_depth_as_its_help_says(resnet32_file: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    help_text = runner.invoke(main, ["import", "--help"]).output
    assert "resnet110_cifar" in help_text and '"depth": 110' in help_text
    base = ["import", "--weights", str(resnet32_file), "--members", "digits:train", "--nonmembers", "digits:test",
            "--limit", "12", "--no-fix-batchnorm"]
    done = runner.invoke(main, base + ["--arch", "resnet_cifar", "--kwargs", '{"depth": 32}', "--out",
                                       str(tmp_path / "ok")])
    assert done.exit_code == 0, done.output
    wrong = runner.invoke(main, base + ["--arch", "resnet20_cifar", "--out", str(tmp_path / "bad")])
    assert wrong.exit_code == 2 and wrong.output.startswith("error:") and "--arch resnet32_cifar" in wrong.output
