"""The ``vitdeploy`` command and ``python -m vitdeploy``: the Typer app, with every usage error and Ctrl-C as one line.

Typer prints a usage error as a framed block; the project's promise is one line naming the problem and what to do,
with exit 2. Ctrl-C, also while the CLI's modules are still importing, is "interrupted" and exit 130.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    try:
        import typer

        try:  # typer >= 0.22 carries its own copy of click
            from typer._click import exceptions as cx
        except ImportError:
            from click import exceptions as cx  # type: ignore[no-redef]

        from vitdeploy.cli import app
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    from vitdeploy.cli.app import flag_given_a_value
    from vitdeploy.core.text import printable

    args = sys.argv[1:] if argv is None else list(argv)
    one_line_warnings(args)
    hint = flag_given_a_value(args)  # `--int8 True`: one line, not MODEL=True
    if hint:
        sys.stderr.write(f"error: {hint}\n")
        return 2
    try:
        code = app(args=argv, prog_name="vitdeploy", standalone_mode=False)
    except cx.NoArgsIsHelpError as e:  # `vitdeploy` or `vitdeploy CMD` alone: the help, as Typer shows it
        sys.stdout.write(e.ctx.get_help() + "\n" if e.ctx is not None else "")
        return 2
    except cx.UsageError as e:
        from vitdeploy.cli.options import range_refusal

        where = f"`{e.ctx.command_path} --help`" if e.ctx is not None else "`vitdeploy --help`"
        if _says_errors():
            sys.stderr.write(f"error: {printable(range_refusal(e) or e.format_message())} (see {where})\n")
        return 2
    except typer.Exit as e:
        return int(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        return 130
    except cx.ClickException as e:
        sys.stderr.write(f"error: {printable(e.format_message())}\n")
        return int(e.exit_code)
    return int(code) if isinstance(code, int) else 0


def _says_errors() -> bool:
    """Under torchrun every rank parses the same options: rank 0 alone says a usage error (all exit 2)."""
    return os.environ.get("RANK", "0") in ("", "0")


def one_line_warnings(argv: list[str]) -> None:
    """Python warnings as one line each on stderr (``warning: MESSAGE``), not the two-line ``file:line: Category:``
    dump with a source line; those that tell a user nothing are silenced here, in the one place (issue 31, 17):
    matplotlib's missing-glyph notes (a label in a script the report font lacks: the figure still draws),
    numpy's RuntimeWarnings (overflow, invalid value: the checks report non-finite results themselves). A
    ``DecompressionBombWarning`` names the file it came from in the skipped/explained line, so it is kept, as
    one line. ``--debug`` or ``PYTHONWARNINGS`` leave Python's own display in place."""
    import warnings

    if sys.warnoptions or "--debug" in argv:
        return
    from vitdeploy.core.text import printable

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: object = None, line: str | None = None) -> None:
        del category, filename, lineno, file, line  # the place in the code says nothing to the user
        text = " ".join(str(message).split())  # one line, however the warning was worded
        sys.stderr.write(f"warning: {printable(text)}\n")

    warnings.showwarning = show
    warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
    warnings.filterwarnings("ignore", message=r"Matplotlib currently using agg", category=UserWarning)
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"numpy(\.|$)")
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"vitdeploy(\.|$)")


if __name__ == "__main__":
    sys.exit(main())
