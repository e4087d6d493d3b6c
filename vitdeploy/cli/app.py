"""The Typer app, its global options and the one error handler every command shares.

Command modules import torch and friends inside the command body, so
``vitdeploy --help`` stays fast and torch-free.
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from vitdeploy import __version__
from vitdeploy.core.errors import EXIT_FAILED, EXIT_USAGE, VitdeployError
from vitdeploy.core.text import printable

if TYPE_CHECKING:
    from rich.progress import TextColumn

app = typer.Typer(
    name="vitdeploy",
    help="Vision Transformers from training to a verified TensorRT engine or ONNX Runtime model.\n\n"
    "Exit codes: 0 done, 1 failed, 2 usage, 3 partly done.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class SafeConsole(Console):
    """A console whose written text carries no terminal control: every segment of text (not rich's own cursor and
    style codes) passes through ``core.text.printable`` with line breaks kept, so a label or file name holding
    ``\x1b[2J`` or U+202E prints as that escape whatever the command that printed it (issue 31, defect 8). Fields
    that must stay on one line (labels, paths) are escaped where they are put into a message, newlines included."""

    def _render_buffer(self, buffer: Any) -> str:
        return super()._render_buffer(
            Segment(printable(text, keep_newlines=True), style, control) if control is None and text else
            Segment(text, style, control) for text, style, control in buffer)


# Not a terminal (a log, a pipe, CI): wide enough that tables keep artifact names on one line.
# markup off: messages carry file names, and "[x].png" must print as written; styled text is passed as rich.Text
console = SafeConsole(markup=False) if sys.stdout.isatty() else SafeConsole(width=160, markup=False)
# soft_wrap: a message is one line however long its file name; a log or a pipe must not split a path in two
err_console = SafeConsole(stderr=True, markup=False, soft_wrap=True)


def text_column(fmt: str, style: str = "") -> TextColumn:
    """A progress bar's text column that prints its text as written: rich's default parses it as markup, so a path
    holding ``[/]`` raised MarkupError on a terminal (and only there: bars are off in a pipe). Every progress bar of
    the CLI builds its text columns here; the style is given apart, never as markup."""
    from rich.progress import TextColumn

    return TextColumn(fmt, style=style, markup=False)
_state = {"debug": False}


def _no_flag_metavar() -> None:
    """Typer 0.29's rich help shows ``<bool>`` beside every flag (TyperOption.display_type_rich does not skip flags, as
    its plain-help twin does), so users type ``--int8 True``; a flag takes no value and shows none."""
    from typer.core import TyperOption

    orig = TyperOption.display_type_rich
    if getattr(orig, "_vitdeploy", False):
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else orig(self, ctx)

    display_type_rich._vitdeploy = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_no_flag_metavar()

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
    # one line: a label or file name in it keeps its newlines and controls as escapes (core.text)
    err_console.print(Text.assemble(("error:", "bold red"), f" {printable(message)}"), highlight=False, soft_wrap=True)
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


BOOL_WORDS = ("true", "false", "yes", "no", "on", "off")


def flag_given_a_value(argv: list[str]) -> str | None:
    """``--int8 True``: a flag followed by a truth word, which click would take as the next argument (a MODEL named
    'True'). The one-line hint, or None. Only looks further when such a word is on the line (cheap otherwise)."""
    if not any(a.lower() in BOOL_WORDS for a in argv):
        return None
    import typer.main

    group = typer.main.get_command(app)
    words = [a for a in argv if not a.startswith("-")]
    cmd = getattr(group, "commands", {}).get(words[0]) if words else None  # typer carries its own click: duck-typed
    if cmd is None:
        return None
    flags = {o: p for p in cmd.params if getattr(p, "is_flag", False) for o in (*p.opts, *p.secondary_opts)}
    for prev, word in zip(argv, argv[1:], strict=False):
        if word.lower() in BOOL_WORDS and prev in flags:
            p = flags[prev]
            on = p.opts[0]
            off = p.secondary_opts[0] if p.secondary_opts else None
            want = word.lower() in ("true", "yes", "on")
            say = on if want else (off or f"nothing (leave out {on})")
            return f"{prev} is a flag and takes no value: write {say}, not {prev} {word}"
    return None


def say_target(target: str | None) -> str | None:
    """The one place a command reads --target: resolved once (TensorRT line, ort, JetPack, module), said once on
    stderr when it was a device name, and returned as the TensorRT line the manifest records."""
    from vitdeploy.core.targets import resolve_target

    facts = resolve_target(target)
    if facts is None:
        return None
    if facts.device is not None:
        dev = facts.device
        unc = f" (unconfirmed: {'; '.join(dev.unconfirmed)})" if dev.unconfirmed else ""
        err_console.print(f"target: {dev.describe()} → {facts.name}{unc}", highlight=False, soft_wrap=True)
    return facts.name


def next_step(*commands: str) -> None:
    """Every command that makes an artifact ends with the command that comes next (DESIGN: Next step)."""
    if commands:
        console.print("next: " + "   or   ".join(commands), highlight=False, soft_wrap=True)


def emit_json(obj: Any, dest: str | Path | None, inputs: list[Any] | None = None) -> bool:
    """``--json FILE|-``: write strict JSON to FILE (atomically) or to stdout for '-'; True when it went to stdout
    (the caller then prints nothing else there). Checks a FILE like every output, before writing."""
    if dest is None:
        return False
    from vitdeploy.core.fileio import check_output, names_stdout, strict_json, write_text_atomic

    if names_stdout(dest):
        sys.stdout.write(strict_json(obj) + "\n")
        return True
    check_output(Path(dest), inputs or [], option="--json")
    write_text_atomic(Path(dest), strict_json(obj) + "\n")
    return False


def check_json_dest(dest: str | Path | None, inputs: list[Any] | None = None) -> None:
    """Refuse an unusable --json FILE before any work (the same check emit_json makes when it writes)."""
    from vitdeploy.core.fileio import check_output, names_stdout

    if dest is not None and not names_stdout(dest):
        check_output(Path(dest), inputs or [], option="--json")


def print_json(obj: Any) -> None:
    from vitdeploy.core.fileio import strict_json  # no bare NaN: null and a note

    sys.stdout.write(strict_json(obj) + "\n")
