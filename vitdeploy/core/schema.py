"""One reader for the fields of a file written elsewhere (a Hugging Face or timm config.json, a processor config):
each field is checked when it is read, against its type, its range and its length, and a field that fails is one
``BadField`` naming the file, the field, its value and what it must be.

Why (issue 37, P1/P2): the importers read ``int(cfg["num_attention_heads"])`` and the like, so a hostile or broken
file surfaced as ``ZeroDivisionError``, ``ValueError: invalid literal for int()``, ``AttributeError: 'list' object
has no attribute 'get'`` or ``RecursionError``, or was accepted and failed later (NaN logits, an allocator error at
export). Every importer reads its files through ``load_json`` (bounded size and depth) and ``Fields`` (typed,
ranged reads), so the rules live here once. The ranges of what is also an option come from core/limits.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitdeploy.core.errors import BadField, VitdeployError
from vitdeploy.core.limits import RANGES

# A model's config.json is kilobytes; with an id2label of 21k ImageNet classes, about a megabyte. A file past this
# is no config, and reading it whole would cost its size in memory.
JSON_MAX_BYTES = 32 * 1024 * 1024
# The configs nest a few levels (vision_config.id2label, model_args.norm_layer). Deeper is refused before anything
# walks it: json.loads itself raises RecursionError near 1000 levels, and the manifest would carry it on.
JSON_MAX_DEPTH = 32

_MISSING = object()


def _short(value: Any, limit: int = 60) -> str:
    """A value as the message shows it: its JSON spelling (Infinity, NaN, null), cut at ``limit`` characters."""
    try:
        s = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        s = repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _depth(value: Any) -> int:
    """The nesting depth of a parsed JSON value, iteratively (a deep value must not recurse here either)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if d > JSON_MAX_DEPTH:
            return d
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def load_json(path: str | Path) -> Any:
    """A JSON file read within JSON_MAX_BYTES and JSON_MAX_DEPTH; one VitdeployError line otherwise."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(JSON_MAX_BYTES + 1)
    except OSError as e:
        raise VitdeployError(f"{p}: cannot read it ({e.strerror or type(e).__name__})") from None
    if len(raw) > JSON_MAX_BYTES:
        raise BadField(f"{p}: larger than {JSON_MAX_BYTES // 2**20} MiB, which no config is; pass the model's own file")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise BadField(f"{p}: nested deeper than {JSON_MAX_DEPTH} levels, which no config is; pass the model's own file") from None
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise BadField(f"{p}: not valid JSON ({str(e)[:80]})") from None
    if _depth(value) > JSON_MAX_DEPTH:
        raise BadField(f"{p}: nested deeper than {JSON_MAX_DEPTH} levels, which no config is; pass the model's own file")
    return value


class Fields:
    """Typed reads of one JSON object of one file: ``Fields(path, obj).integer("num_attention_heads", 12, lo=1)``.

    ``prefix`` names where the object sits in the file (``vision_config.``, ``model_args.``); every refusal is
    ``BadField``: ``FILE: FIELD VALUE must be WHAT; fix FILE``. A field absent (or, with ``null_is_default``, null)
    takes the default.
    """

    def __init__(self, where: str | Path, obj: Any, prefix: str = "", null_is_default: bool = False) -> None:
        self.where = str(where)
        self.prefix = prefix
        self.null_is_default = null_is_default
        if not isinstance(obj, dict):
            what = prefix.rstrip(".") or "the file"
            raise BadField(f"{self.where}: {what} must be a JSON object {{...}}, not {type(obj).__name__} "
                           f"{_short(obj, 30)}; pass the model's own config")
        self.obj: dict[str, Any] = obj

    # --- the one refusal ---
    def refuse(self, name: str, value: Any, what: str) -> BadField:
        fix = Path(self.where).name or self.where
        return BadField(f"{self.where}: {self.prefix}{name} {_short(value)} must be {what}; fix {fix}")

    def has(self, name: str) -> bool:
        return name in self.obj and not (self.null_is_default and self.obj[name] is None)

    def raw(self, name: str, default: Any = None) -> Any:
        return self.obj[name] if self.has(name) else default

    def sub(self, name: str) -> Fields | None:
        """A nested object (``vision_config``) as Fields, or None where absent or null."""
        if self.obj.get(name) is None:
            return None
        return Fields(self.where, self.obj[name], f"{self.prefix}{name}.", self.null_is_default)

    # --- scalars ---
    def _range(self, name: str, v: float, lo: float | None, hi: float | None, idea: str | None,
               kind: str, above: float | None) -> None:
        if idea is not None:
            lo, hi = RANGES[idea]["min"], RANGES[idea]["max"]
        if above is not None and not v > above:
            raise self.refuse(name, v, f"{kind} above {above}" + (f" and at most {hi}" if hi is not None else ""))
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            if lo is not None and hi is not None:
                span = f"from {lo} to {hi}"
            else:
                span = f"at least {lo}" if lo is not None else f"at most {hi}"
            raise self.refuse(name, v, f"{kind} {span}")

    def as_int(self, name: str, v: Any, lo: int | None = None, hi: int | None = None, idea: str | None = None) -> int:
        """``v`` (read from ``name``) as an int in range: a JSON integer (or an integral number), never a bool."""
        ok = (isinstance(v, int) and not isinstance(v, bool)) or (
            isinstance(v, float) and math.isfinite(v) and v.is_integer())
        if not ok:
            rng = RANGES[idea] if idea is not None else {"min": lo, "max": hi}
            span = f" from {rng['min']} to {rng['max']}" if rng["min"] is not None and rng["max"] is not None else ""
            raise self.refuse(name, v, f"a whole number{span}")
        n = int(v)
        self._range(name, n, lo, hi, idea, "a whole number", None)
        return n

    def integer(self, name: str, default: Any = _MISSING, lo: int | None = None, hi: int | None = None,
            idea: str | None = None) -> int:
        v = self._get(name, default)
        return self.as_int(name, v, lo, hi, idea)

    def as_float(self, name: str, v: Any, lo: float | None = None, hi: float | None = None,
                 above: float | None = None, idea: str | None = None) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            if lo is not None and hi is not None:
                span = f" from {lo} to {hi}"
            elif above is not None:
                span = f" above {above}"
            else:
                span = ""
            raise self.refuse(name, v, f"a finite number{span}")
        self._range(name, v, lo, hi, idea, "a number", above)  # the value as the file wrote it (0, not 0.0)
        return float(v)

    def number(self, name: str, default: Any = _MISSING, lo: float | None = None, hi: float | None = None,
              above: float | None = None, idea: str | None = None) -> float:
        return self.as_float(name, self._get(name, default), lo, hi, above, idea)

    def flag(self, name: str, default: Any = _MISSING) -> bool:
        v = self._get(name, default)
        if not isinstance(v, bool):
            raise self.refuse(name, v, "true or false")
        return v

    def text(self, name: str, default: Any = _MISSING, choices: Sequence[str] | None = None) -> str:
        v = self._get(name, default)
        if not isinstance(v, str) or (choices is not None and v not in choices):
            what = f"one of {', '.join(choices)}" if choices is not None else "a string"
            raise self.refuse(name, v, what)
        return v

    # --- compounds ---
    def size(self, name: str, default: Any = _MISSING, idea: str = "image_size") -> tuple[int, int]:
        """An image or patch size: one whole number, or a list of two (height, width), each in ``idea``'s range."""
        v = self._get(name, default)
        if isinstance(v, (list, tuple)):
            if len(v) != 2:
                raise self.refuse(name, v, "one whole number or a list of two (height, width)")
            return (self.as_int(name, v[0], idea=idea), self.as_int(name, v[1], idea=idea))
        n = self.as_int(name, v, idea=idea)
        return (n, n)

    def numbers(self, name: str, default: Any = _MISSING, lengths: Sequence[int] = (3,), lo: float | None = None,
                above: float | None = None, hi: float | None = None) -> list[float]:
        """A list of finite numbers of one of ``lengths`` (a bare number counts as one)."""
        v = self._get(name, default)
        items = list(v) if isinstance(v, (list, tuple)) else [v]
        if len(items) not in lengths:
            want = " or ".join(str(n) for n in lengths)
            raise self.refuse(name, v, f"a list of {want} numbers (one per RGB channel)")
        return [self.as_float(name, x, lo=lo, hi=hi, above=above) for x in items]

    def _get(self, name: str, default: Any) -> Any:
        if self.has(name):
            return self.obj[name]
        if default is _MISSING:
            raise BadField(f"{self.where}: no {self.prefix}{name}, which it must have; pass the model's own config")
        return default
