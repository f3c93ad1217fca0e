"""Power before the audit (audit/canaries/power.py, `audit canaries make --claim`): what a kit can refute."""

from __future__ import annotations

import pytest

from audit.canaries.power import KIT_SIZES, kit_power, size_kit
from hostile_common import assert_error, cli


def test_memorising_less_detects_less_and_the_ceiling_bounds_everything() -> None:
    full = kit_power(m=1000, memorisation=1.0)
    half = kit_power(m=1000, memorisation=0.5)
    tenth = kit_power(m=1000, memorisation=0.1)
    assert full.detectable == full.ceiling == half.ceiling
    assert full.ceiling > half.detectable > tenth.detectable >= 0.0
    assert "1000 canaries" in half.sentence() and "50%" in half.sentence()


def test_the_kit_is_the_smallest_that_refutes_the_claim() -> None:
    power = size_kit(claim=1.5, memorisation=0.5)
    assert power is not None and power.detectable > 1.5
    smaller = [m for m in KIT_SIZES if m < power.m]
    assert all(not kit_power(m=m, memorisation=0.5).detectable > 1.5 for m in smaller[-1:])


def test_bad_arguments_are_value_errors() -> None:
    for kwargs in ({"m": 5}, {"m": 100, "alpha": 0.0}, {"m": 100, "memorisation": 0.0}):
        with pytest.raises(ValueError):
            kit_power(**kwargs)


def test_make_states_its_power_and_refuses_a_claim_no_kit_can_refute(tmp_path) -> None:
    r = cli("canaries", "make", "--num-classes", "10", "--image-size", "8", "--count", "500", "--seed", "1",
            "--out", tmp_path / "kit", "--claim", "1.0")
    assert r.exit_code == 0, r.output
    assert "power: this kit (500 canaries" in r.output and "can refute a claim below" in r.output
    assert_error(cli("canaries", "make", "--num-classes", "10", "--image-size", "8", "--seed", "1",
                     "--out", tmp_path / "kit8", "--claim", "8", "--memorisation", "0.5"),
                 r"no kit of up to 20000 canaries can refute ε = 8")
    assert not (tmp_path / "kit8").exists()
