"""The `audit` command line: thin click adapters over library functions.

Each sub-command lives in ``audit/commands/<name>.py`` and exposes a click command named ``command``.
Errors caused by the user's input (:class:`foundation.errors.UserError`) print one line and exit with code 2.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys

import click

from foundation.errors import UserError

#: Command name -> (module under audit/commands/, one-line help). Modules are imported only when their command
#: runs (or its own --help is asked for), so ``audit -h`` starts without torch.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("train", "One DP (or non-DP) training run from a config."),
    "accountant": ("accountant", "Epsilon of (sigma, q, T, delta) from PRV, RDP and PLD; sigma for a target."),
    "attack": ("attack", "Membership inference against a run (reference models, LiRA, RMIA, ...)."),
    "import": ("import_", "Wrap an externally trained checkpoint in a run directory with a manifest."),
    "epsilon": ("epsilon", "Empirical epsilon lower bounds and the verdict on a run's claim."),
    "transfer": ("transfer", "Downstream transfer (linear probe, k-NN, fine-tuning) of a run's model."),
    "report": ("report", "The compliance report of a run (HTML, Markdown, JSON; --pdf)."),
    "gate": ("gate", "CI regression gate: candidate vs baseline under a policy (exit 0 pass, 1 fail, 3 unverifiable)."),
    "run": ("run", "Train, attack, estimate epsilon, transfer and report for every variant of a config."),
    "canaries": ("canaries", "Auditor canaries for a vendor's model: make the package and the commitment."),
    "mechanism": ("mechanism", "Tight audit of the DP-SGD mechanism implementation with Dirac gradient canaries."),
}


class AuditGroup(click.Group):
    """A click group that turns :class:`UserError` and click's usage errors (a missing argument, a path that
    does not exist, an unknown option) into a one-line message and exit code 2.

    Sub-commands load lazily (:data:`COMMANDS`): listing them reads only the table above.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        if cmd_name not in self.commands:  # loaded once, then a registered command like any other
            self.add_command(importlib.import_module(f"audit.commands.{entry[0]}").command, cmd_name)
        return self.commands[cmd_name]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, short) in COMMANDS.items()])

    def invoke(self, ctx: click.Context):  # noqa: D401
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a bad argument or option: one line, like every other input error
            command = f"audit {ctx.invoked_subcommand}" if ctx.invoked_subcommand else "audit"
            click.echo(f"error: {exc.format_message().rstrip('.')} (see '{command} --help')", err=True)
            sys.exit(2)
        except UserError as exc:
            if os.environ.get("RANK", "0") == "0":  # under torchrun every rank fails alike: rank 0 says so once
                click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo(f"interrupted: outputs written so far are complete; {resume_hint(ctx.invoked_subcommand)}",
                       err=True)
            sys.exit(130)
        except (MemoryError, RuntimeError) as exc:  # torch reports a failed allocation as a RuntimeError
            if not isinstance(exc, MemoryError) and not is_out_of_memory(exc):
                raise
            click.echo(f"error: {OUT_OF_MEMORY}", err=True)
            sys.exit(2)
        except OSError as exc:
            click.echo(f"error: {os_error_message(exc)}", err=True)
            sys.exit(2)


OUT_OF_MEMORY = ("out of memory; lower data.image_size, data.pool_size or training.physical_batch_size (attacks: "
                 "attack.signal_batch_size, attack.max_models_per_batch), or run where more memory is free")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed allocation: ``MemoryError``, or the ``RuntimeError`` torch raises for one (CPU
    "can't allocate memory", CUDA/MPS "out of memory").

    >>> is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory"))
    True
    >>> is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    False
    """
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


def resume_hint(command: str | None) -> str:
    """How to continue an interrupted command, naming only flags that command has.

    >>> resume_hint("train")
    're-run with --resume to continue'
    >>> resume_hint("attack")
    're-run the same command to continue (finished steps and reference models are re-used)'
    """
    if command == "train":
        return "re-run with --resume to continue"
    return "re-run the same command to continue (finished steps and reference models are re-used)"


def os_error_message(exc: OSError) -> str:
    """One line for a disk or permission error: what failed, on which file, and what to do.

    >>> import errno
    >>> os_error_message(OSError(errno.ENOSPC, "No space left on device", "/r/model.safetensors"))
    'no space left on device writing /r/model.safetensors; free disk space or choose another output_dir, then re-run'
    >>> os_error_message(OSError(errno.EIO, "Input/output error", "/r/epsilon.json"))
    'Input/output error on /r/epsilon.json; check the disk (space, permissions, health), then re-run'
    """
    where = f" {exc.filename}" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on device writing{where}; free disk space or choose another output_dir, then re-run"
    if exc.errno == errno.EFBIG:
        return (f"file too large writing{where} ({exc.strerror}); choose an output_dir on a file system that allows "
                "larger files, then re-run")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"permission denied on{where or ' a file'} ({exc.strerror}); choose a writable output directory"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        return f"{exc.strerror}:{where}; a path that should be a directory is a file (or the reverse)"
    return f"{exc.strerror or exc} on{where or ' a file'}; check the disk (space, permissions, health), then re-run"


@click.group(cls=AuditGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dp-audit")
def main() -> None:
    """Privacy auditing and evaluation for differentially private vision models."""



if __name__ == "__main__":  # pragma: no cover
    main()
