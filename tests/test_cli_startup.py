"""`audit -h` lists every command without importing torch (commands load lazily), and every listed command
resolves to its click command."""

from __future__ import annotations

import subprocess
import sys

import click

from audit.cli import COMMANDS, main


def test_help_imports_no_torch() -> None:
    code = ("import sys\nfrom audit.cli import main\ntry:\n    main(['-h'], prog_name='audit')\n"
            "except SystemExit:\n    pass\nprint('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().endswith("NO-TORCH")
    for name in COMMANDS:
        assert f"  {name} " in out.stdout


def test_every_listed_command_loads() -> None:
    ctx = click.Context(main)
    assert main.list_commands(ctx) == list(COMMANDS)
    for name in COMMANDS:
        cmd = main.get_command(ctx, name)
        assert isinstance(cmd, click.Command) and cmd.name == name
    assert main.get_command(ctx, "nope") is None
