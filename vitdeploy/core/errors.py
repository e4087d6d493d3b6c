"""Errors a user can act on: the CLI prints the message as one line and exits with ``exit_code``."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3


class VitdeployError(Exception):
    """A problem the user can fix; the message names it and says what to do."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(VitdeployError):
    exit_code = EXIT_USAGE


class PartlyDone(VitdeployError):
    """Part of the job is done and written; the message says what is left and how to finish it."""

    exit_code = EXIT_PARTIAL


class ParityError(VitdeployError):
    """An exported or converted model does not answer like its source within the tolerance."""
