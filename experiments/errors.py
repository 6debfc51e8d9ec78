"""Errors a user can cause, and how an entry point reports them.

A user-caused error (a missing file, a bad value, an unknown name) is a ``ValueError`` whose
message names the config field and the value (``ConfigError`` builds such a message), or a
``FileNotFoundError``. An entry point prints it as one line on stderr and exits with status 2;
``HYDRA_FULL_ERROR=1`` shows the traceback instead. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import os
import sys

from omegaconf.errors import OmegaConfBaseException

EXIT_USER_ERROR = 2
USER_ERRORS = (ValueError, FileNotFoundError, OmegaConfBaseException)


class ConfigError(ValueError):
    """A bad value of one config field: ``"<field>=<value>: <problem>"``."""

    def __init__(self, field: str, value: object, problem: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field}={value}: {problem}")


def is_user_error(e: BaseException) -> bool:
    return isinstance(e, USER_ERRORS)


def one_line(e: BaseException) -> str:
    """The error's message on one line (a multi-line message is joined with ' | ')."""
    text = str(e).strip() or type(e).__name__
    if isinstance(e, FileNotFoundError) and e.filename is not None:
        text = f"no such file or directory: {e.filename}"
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def full_errors() -> bool:
    """Whether the user asked for tracebacks (``HYDRA_FULL_ERROR=1``, as hydra reads it)."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def exit_with(e: BaseException) -> None:
    """Print ``e`` as one ``error:`` line on stderr and exit with ``EXIT_USER_ERROR``."""
    print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USER_ERROR)
