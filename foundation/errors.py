"""User-facing errors.

Every problem caused by the user's input (a missing file, a wrong key, an impossible epsilon) is raised as
:class:`UserError` with a one-line message that says what was wrong and how to fix it. The CLI turns it into
``error: <message>`` on stderr and exit code 2, with no traceback.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user: printed as one line by the CLI, exit code 2."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class ConfigError(UserError):
    """A configuration file or override is invalid."""


class DataError(UserError):
    """A dataset root, file or array is missing or malformed."""


class CheckpointError(UserError):
    """A checkpoint, manifest or run directory is missing, corrupt or does not match."""


class UntrustedCodeError(UserError):
    """A config or run directory names code to import (``model.arch: package.module:factory``) and the caller
    did not say it trusts whoever wrote it (``trust_code=True``, ``--trust-code``)."""


class TrainingDiverged(UserError):
    """Training produced a non-finite loss: the run stops with the last good state kept."""
