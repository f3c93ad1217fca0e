"""The seed-paper research is its own package: the product never imports it, it has one command line whose
subcommands keep the old scripts' options, and it ships with the product's wheel and console scripts."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from experiments import cli

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("foundation", "training", "attacks", "audit")


def imported_packages(source: str) -> set[str]:
    """The top-level packages a module's import statements name (relative imports aside)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_the_product_never_imports_the_research():
    assert imported_packages("import os\nfrom experiments.stats import holm\n") >= {"os", "experiments"}
    assert "experiments" in imported_packages("def f():\n    import experiments.arms as a\n")
    offenders = [str(p.relative_to(ROOT)) for pkg in PRODUCT for p in sorted((ROOT / pkg).rglob("*.py"))
                 if "experiments" in imported_packages(p.read_text(encoding="utf-8"))]
    assert not offenders, f"product modules importing experiments: {offenders}"


def test_the_research_imports_only_the_product_and_itself():
    ours = set(PRODUCT) | {"experiments"}
    local = {p.parent.name for p in ROOT.glob("*/__init__.py")} | {"benchmarks", "tests", "examples"}
    for p in sorted((ROOT / "experiments").rglob("*.py")):
        assert not (imported_packages(p.read_text(encoding="utf-8")) & local) - ours, p


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_subcommand_has_its_help_under_its_own_name(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0 and f"usage: python -m experiments {command}" in capsys.readouterr().out


def test_an_unknown_subcommand_is_one_line_and_exit_2():
    res = subprocess.run([sys.executable, "-m", "experiments", "seed_findings.py"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == ("error: unknown command 'seed_findings.py': choose one of "
                                                   + ", ".join(cli.COMMANDS))


def test_the_wheel_carries_the_package_and_its_console_script():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "experiments*" in project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert project["project"]["scripts"]["dp-audit-experiments"] == "experiments.cli:main"
    assert "experiments" in project["tool"]["pytest"]["ini_options"]["testpaths"]  # its doctests run


def test_tables_never_drop_rows_whose_runs_are_elsewhere(tmp_path, monkeypatch, capsys):
    """`papers tables` keeps a committed table that the runs on this machine would shrink (e.g. a lease's runs,
    not archived here); --force overwrites it; a table that keeps or grows its rows is written."""
    import experiments.papers.continual as continual
    import experiments.papers.finetune as finetune
    from experiments.papers import cli as papers_cli

    full = "# t\n\n| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n"
    fewer = "# t\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    monkeypatch.setattr(papers_cli, "OUT", tmp_path)
    monkeypatch.setattr(papers_cli, "ROOT", tmp_path)
    monkeypatch.setattr(continual, "table_continual", lambda scale: full)
    monkeypatch.setattr(continual, "table_decelerator", lambda scale: None)
    monkeypatch.setattr(finetune, "table_finetune", lambda scale: fewer)
    (tmp_path / "finetune_strategies.s.md").write_text(full)
    papers_cli.tables("s")
    assert (tmp_path / "continual_pretrain.s.md").read_text() == full
    assert not (tmp_path / "decelerator.s.md").exists()
    assert (tmp_path / "finetune_strategies.s.md").read_text() == full
    assert "kept" in capsys.readouterr().out
    papers_cli.tables("s", force=True)
    assert (tmp_path / "finetune_strategies.s.md").read_text() == fewer
