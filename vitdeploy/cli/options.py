"""Option wording every command shares, so one idea has one name, one short option and one help text.

Conventions (README, docs/cli.md): -o out, -i images, -m model (where the model is an option), -t target,
-b batch size, --json FILE|- (strict JSON to FILE, '-' for stdout alone). Old names stay as hidden aliases.
"""

from __future__ import annotations

from vitdeploy.core.limits import Bounds, bounds, range_message

TARGET_NAMES = ("trt8.5, trt8.6, trt10, trt11 (or a version: trt10.3), cpu (old name ort) or openvino (a CPU), or the device: a JetPack "
                "(jetpack5.1 … jetpack7.2, 'JetPack 6.1', jp6.1) and/or a Jetson module (agx-orin, orin-nx, "
                "orin-nano, agx-xavier, xavier-nx, thor), e.g. jetpack6.1-orin-nano")
JSON_HELP = "Write the results as JSON to FILE ('-': stdout alone, without the table)."
IMAGES_ALIAS_HELP = "Old name of --images."


# --- numeric options: one range table (core/limits.py), on every Typer option ----------------------------------------
# ``typer.Option(8, **bounded("batch"), ...)``: Typer shows the range in --help ([1<=x<=4096]) and refuses a value
# outside it before the command runs; ``range_refusal`` turns its message into the project's one line.


def bounded(idea: str) -> Bounds:
    """``min`` and ``max`` of one idea of the range table, as Typer's Option takes them."""
    return bounds(idea)


def range_refusal(error: BaseException) -> str | None:
    """The one-line refusal of a numeric option outside its range (or not a number), from Typer's BadParameter:
    '--epochs must be at most 100000, not 99999999999999999999'. None for any other usage error."""
    param = getattr(error, "param", None)
    lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    if param is None or lo is None or hi is None:
        return None
    cause = error.__cause__
    errors = getattr(cause, "errors", None)
    if errors is None:
        return None
    try:
        value = errors()[0]["input"]
    except (IndexError, KeyError, TypeError):
        return None
    opts = list(getattr(param, "opts", [])) or [str(getattr(param, "name", "the value"))]
    name = max(opts, key=len)  # --batch-size rather than -b
    whole = getattr(getattr(param, "type_descriptor", None), "annotation", None) is int
    if whole and isinstance(value, str):
        try:
            int(value)
        except ValueError:
            return f"{name} takes a whole number from {lo} to {hi}, not {value!r}"
    return range_message(name, value, {"min": lo, "max": hi})
