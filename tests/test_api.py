"""The public Python API (audit.train / attack / epsilon / report / gate).

The README's notebook blocks (Python API, Opacus auditor, mechanism) run pasted, each in a fresh interpreter from a
temporary directory, in tests/test_readme.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import audit
from audit.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_api_equals_cli(tmp_path, monkeypatch):
    """Each function gives what its command prints and writes, for the same arguments."""
    monkeypatch.chdir(ROOT)
    overrides = {"output_dir": str(tmp_path), "name": "api", "training.steps": 6, "training.batch_size": 64,
                 "training.gradient_canaries.count": 50}
    run = audit.train("eval_configs/quickstart_train.yaml", overrides=overrides)
    cli = CliRunner().invoke(main, ["train", "eval_configs/quickstart_train.yaml",
                                    *(a for k, v in overrides.items() for a in ("--set", f"{k}={v}")),
                                    "--set", "name=cli", "--no-progress"])
    assert cli.exit_code == 0, cli.output
    api_m = run.manifest.model_dump()
    cli_m = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert cli_m["privacy"]["epsilon"] == api_m["privacy"]["epsilon"]
    assert cli_m["model"]["weights_sha256"] == api_m["model"]["weights_sha256"]  # same training, bit for bit

    rep = audit.epsilon(run.run_dir, sources=["gradient_canaries"], alpha=0.1)
    written = json.loads(rep.path.read_text())
    cli = CliRunner().invoke(main, ["epsilon", str(tmp_path / "cli"), "--sources", "gradient_canaries",
                                    "--alpha", "0.1"])
    assert cli.exit_code == 0, cli.output
    assert json.loads((tmp_path / "cli" / "epsilon.json").read_text())["estimates"] == written["estimates"]
    assert str(rep.verdict.status) in cli.output

    paths = audit.report(run.run_dir, images=False)
    assert paths.html.is_file() and str(paths.report.glance.status) == str(rep.verdict.status)
    result = audit.gate(tmp_path / "cli", run.run_dir, policy="eval_configs/gates/white_box.yaml",
                        out=tmp_path / "gate.json")
    cli = CliRunner().invoke(main, ["gate", str(tmp_path / "cli"), str(run.run_dir), "--policy",
                                    "eval_configs/gates/white_box.yaml", "--out", str(tmp_path / "gate-cli.json")])
    # 20 steps audited by their gradient canaries cannot refute ε = 8: the gate says so (exit 3), never PASS
    assert cli.exit_code == result.exit_code == 3 and result.status == "UNVERIFIABLE", cli.output
    strip = lambda d: {k: v for k, v in d.items()  # noqa: E731
                       if k not in ("created", "evaluated_at", "time", "evidence")}
    assert strip(json.loads((tmp_path / "gate.json").read_text())) == \
        strip(json.loads((tmp_path / "gate-cli.json").read_text()))


def test_api_bad_input_is_one_line_user_error(tmp_path):
    from foundation.errors import UserError

    with pytest.raises(UserError, match="run directory not found"):
        audit.epsilon(tmp_path / "missing")
    with pytest.raises(UserError):
        audit.train(tmp_path / "missing.yaml")
    with pytest.raises(TypeError, match="list of 'key=value' strings"):
        audit.train("eval_configs/quickstart_train.yaml", overrides="training.steps=1")


#: Strings that YAML text would turn into something else: a comment, a bool, an int, a mapping.
TRICKY = {"data.root": "/data/set #2", "output_dir": "no", "name": "01", "model.freeze": ["a: b"]}


def test_mapping_overrides_are_typed_not_reparsed(monkeypatch):
    """``overrides={...}`` values reach the config as given, and the recorded command's ``--set`` texts read back to
    the same values; ``--set`` strings stay YAML scalars (``no`` is False, ``01`` is 1)."""
    from audit.config import load_run_config
    from foundation.config_io import override_text, parse_override, to_overrides
    import training.trainer

    seen = {}
    monkeypatch.setattr(training.trainer, "train", lambda cfg, **kw: seen.update(cfg=cfg, **kw))
    audit.train(ROOT / "eval_configs" / "quickstart_train.yaml", overrides=TRICKY)
    cfg = seen["cfg"]
    assert (cfg.data.root, cfg.output_dir, cfg.name, cfg.model.freeze) == ("/data/set #2", "no", "01", ("a: b",))
    from audit.bounds.claim_check import _overrides

    recorded = {k: parse_override(f"{k}={v}")[1] for k, v in _overrides(seen["command"])}
    assert recorded == TRICKY  # the provenance's command line re-makes the same config
    for pair in to_overrides(TRICKY):
        assert to_overrides([override_text(pair)]) == (pair,)
    assert to_overrides(["output_dir=no", "name=01", "data.root=/data/set #2", "x=a: b"]) == (
        (("output_dir",), False), (("name",), 1), (("data", "root"), "/data/set"), (("x",), {"a": "b"}))
    with pytest.raises(Exception, match="name"):  # the --set form of name=01 is an int, which the config refuses
        load_run_config(ROOT / "eval_configs" / "quickstart_train.yaml", ["name=01"])


def test_public_functions_have_real_signatures_docstrings_and_help():
    """audit.train / attack / epsilon / report / gate (and the mechanism audits) are plain functions: named
    parameters (no ``*args, **kwargs`` of a callable module), a docstring, ``help()`` that shows the function; no
    module of the ``audit`` package bears one of their names (importing it would shadow the function)."""
    import inspect
    import pkgutil
    import pydoc

    names = ("train", "attack", "epsilon", "report", "gate", "audit_mechanism", "audit_opacus_mechanism")
    for name in names:
        fn = getattr(audit, name)
        assert inspect.isfunction(fn), f"audit.{name} is a {type(fn).__name__}"
        params = inspect.signature(fn).parameters.values()
        assert params and not [p for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)], name
        assert fn.__doc__ and f"{name}(" in pydoc.render_doc(fn, renderer=pydoc.plaintext), name
    assert list(inspect.signature(audit.epsilon).parameters)[:3] == ["run", "alpha", "sources"]
    assert not {m.name for m in pkgutil.iter_modules(audit.__path__)} & set(names)
