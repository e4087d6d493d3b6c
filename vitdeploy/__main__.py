"""The ``vitdeploy`` command and ``python -m vitdeploy``: the Typer app, with every usage error and Ctrl-C as one line.

Typer prints a usage error as a framed block; the project's promise is one line naming the problem and what to do,
with exit 2. Ctrl-C, also while the CLI's modules are still importing, is "interrupted" and exit 130.
"""

from __future__ import annotations

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

    hint = flag_given_a_value(sys.argv[1:] if argv is None else list(argv))  # `--int8 True`: one line, not MODEL=True
    if hint:
        sys.stderr.write(f"error: {hint}\n")
        return 2
    try:
        code = app(args=argv, prog_name="vitdeploy", standalone_mode=False)
    except cx.NoArgsIsHelpError as e:  # `vitdeploy` or `vitdeploy CMD` alone: the help, as Typer shows it
        sys.stdout.write(e.ctx.get_help() + "\n" if e.ctx is not None else "")
        return 2
    except cx.UsageError as e:
        where = f"`{e.ctx.command_path} --help`" if e.ctx is not None else "`vitdeploy --help`"
        sys.stderr.write(f"error: {e.format_message()} (see {where})\n")
        return 2
    except typer.Exit as e:
        return int(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        return 130
    except cx.ClickException as e:
        sys.stderr.write(f"error: {e.format_message()}\n")
        return int(e.exit_code)
    return int(code) if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
