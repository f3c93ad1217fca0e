"""training.device.resolve_device: the one resolver of a ``device`` setting."""

from __future__ import annotations

import pytest
import torch

from training.device import resolve_device
from foundation.errors import ConfigError


@pytest.mark.parametrize("cuda", [False, True])
def test_auto_follows_cuda_availability(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_device("auto") == torch.device("cuda" if cuda else "cpu")


def test_cuda_without_a_gpu_names_the_setting(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match=r"^attack\.device is '" + name + "' but no CUDA device"):
            resolve_device(name, field="attack.device")


def test_names_and_devices_pass_through():
    assert resolve_device("cpu") == torch.device("cpu")
    dev = torch.device("cpu")
    assert resolve_device(dev) is dev


def test_unknown_name_is_a_config_error():
    with pytest.raises(ConfigError, match=r"training\.device 'tpu9' is not a device torch knows"):
        resolve_device("tpu9", field="training.device")
