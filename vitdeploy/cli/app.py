"""The Typer app, its global options and the one error handler every command shares.

Command modules import torch and friends inside the command body, so
``vitdeploy --help`` stays fast and torch-free.
"""

from __future__ import annotations

import functools
import json
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from vitdeploy import __version__
from vitdeploy.core.errors import EXIT_FAILED, EXIT_USAGE, VitdeployError

app = typer.Typer(
    name="vitdeploy",
    help="Vision Transformers from training to a verified TensorRT engine or ONNX Runtime model.\n\n"
    "Exit codes: 0 done, 1 failed, 2 usage, 3 partly done.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# Not a terminal (a log, a pipe, CI): wide enough that tables keep artifact names on one line.
# markup off: messages carry file names, and "[x].png" must print as written; styled text is passed as rich.Text
console = Console(markup=False) if sys.stdout.isatty() else Console(width=160, markup=False)
err_console = Console(stderr=True, markup=False)
_state = {"debug": False}

F = TypeVar("F", bound=Callable[..., Any])


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vitdeploy {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    _state["debug"] = debug


def fail(message: str, code: int = EXIT_FAILED) -> None:
    # the message is text, not markup: "vitdeploy[cpu]" must print as written
    err_console.print(Text.assemble(("error:", "bold red"), f" {message}"), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """One line and an exit code for user errors; a traceback only with --debug."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except VitdeployError as e:
            if _state["debug"]:
                traceback.print_exc()
            fail(str(e), e.exit_code)
        except KeyboardInterrupt:
            err_console.print("interrupted")
            raise typer.Exit(130) from None
        except Exception as e:  # noqa: BLE001 - the last line of defence: no traceback without --debug
            if _state["debug"]:
                traceback.print_exc()
            fail(f"{type(e).__name__}: {e} (run `vitdeploy --debug ...` for the traceback)", EXIT_FAILED)

    return wrapper  # type: ignore[return-value]


def styled(label: str, style: str, text: str) -> Text:
    """``label`` in ``style``, then ``text`` as written (file names with brackets included)."""
    return Text.assemble((label, style), f" {text}")


def usage(message: str) -> None:
    fail(message, EXIT_USAGE)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
