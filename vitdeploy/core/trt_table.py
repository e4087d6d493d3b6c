"""The TensorRT version table: what each TensorRT line can do, read from NVIDIA's own sources.

The data is ``trt_facts.json`` beside this module, written by ``scripts/extract_trt_facts.py`` from the
NVIDIA/TensorRT release branches (pybind11 sources, headers, trtexec's sampleOptions.cpp) and the onnx-tensorrt
commit each branch pins (docs/operators.md, the importers). Every fact carries its source; a fact no source
gave is the string ``"unconfirmed"``. Rows: 8.5, 8.6, 9.x, 10.0-10.7, 10.8+, 11.x. This module only reads
JSON (no TensorRT, no onnx), so the graph writers, the runners, the checks and the test mock share one table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

ROWS: tuple[str, ...] = ("8.5", "8.6", "9.x", "10.0-10.7", "10.8+", "11.x")
UNCONFIRMED = "unconfirmed"
# DLA after the branches the table reads: NVIDIA's release notes (as quoted in shared/TENSORRT.md).
DLA_11_FROM = (11, 4, 1)
DLA_11_NOTE = "TensorRT 11.4.1+ has DLA on JetPack 7.2.2+ only (NVIDIA release notes; not read from a source file)"


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    """The whole JSON document (cached)."""
    text = resources.files("vitdeploy.core").joinpath("trt_facts.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def version_tuple(v: str | tuple[int, ...]) -> tuple[int, ...]:
    """'10.3.0.30' -> (10, 3, 0, 30); trailing text ('rc1', '+cuda12') ignored."""
    if isinstance(v, tuple):
        return v
    parts = []
    for piece in str(v).strip().split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    if not parts:
        raise ValueError(f"not a version: {v!r}")
    return tuple(parts)


def row_of(version: str | tuple[int, ...]) -> str:
    """The table row of a TensorRT version; a ValueError below 8.5 (vitdeploy's oldest)."""
    v = version_tuple(version)
    mm = (v + (0,))[:2]
    if mm < (8, 5):
        raise ValueError(f"TensorRT {'.'.join(map(str, v))} is older than the table's first row (8.5)")
    if mm == (8, 5) or (v[0] == 8 and mm < (8, 6)):
        return "8.5"
    if v[0] == 8:
        return "8.6"
    if v[0] == 9:
        return "9.x"
    if v[0] == 10:
        return "10.0-10.7" if mm[1] <= 7 else "10.8+"
    return "11.x"  # 11 and anything newer: the newest row read


def row(name: str) -> dict[str, Any]:
    rows: dict[str, Any] = table()["rows"]
    if name not in rows:
        raise ValueError(f"unknown TensorRT row {name!r}: one of {', '.join(ROWS)}")
    out: dict[str, Any] = rows[name]
    return out


def value(row_name: str, key: str) -> Any:
    return row(row_name)[key]["value"]


def source(row_name: str, key: str) -> str:
    return str(row(row_name)[key]["source"])


def _release_key(v: str) -> tuple[int, ...]:
    return version_tuple(v)


def parser_release(version: str | tuple[int, ...]) -> str | None:
    """The release whose ONNX parser facts stand for ``version``: itself where read, else the nearest earlier read one.

    Parsers gain operators and opsets release by release (the lists read never lose one), so the nearest earlier
    list read is a lower bound of what ``version`` parses. None below the first release read.
    """
    v = version_tuple(version)[:2]
    read = sorted((r for r, f in table()["releases"].items() if f.get("parser_read")), key=_release_key)
    best = None
    for r in read:
        if _release_key(r)[:2] <= v:
            best = r
    return best


def max_opset(version: str | tuple[int, ...]) -> tuple[int | None, str]:
    """(the highest ONNX opset the parser of ``version`` reads, where that was read)."""
    rel = parser_release(version)
    if rel is None:
        return None, UNCONFIRMED
    f = table()["releases"][rel]
    vs = ".".join(map(str, version_tuple(version)[:2]))
    note = f["parser_source"] + ("" if rel == vs else f" (read at {rel}; {vs}'s own list not read: a lower bound)")
    return int(f["max_opset"]), note


def ops_row(version: str | tuple[int, ...]) -> tuple[str, dict[str, Any]]:
    """(row name, its operator support) for the parser that stands for ``version``: its row where the row's list
    was read, else the row of the nearest earlier release read."""
    r = row_of(version)
    ops = value(r, "onnx_ops")
    if isinstance(ops, dict):
        return r, ops
    rel = parser_release(version)
    if rel is None:
        return r, {}
    r2 = row_of(rel)
    return r2, value(r2, "onnx_ops")


def has_dla(version: str | tuple[int, ...]) -> bool | str:
    """Whether this TensorRT has DLA (True/False, or "unconfirmed")."""
    v = version_tuple(version)
    if v[0] >= 11 and (v + (0, 0))[:3] >= DLA_11_FROM:
        return True
    out: bool | str = value(row_of(v), "dla")
    return out


def python_names(row_name: str) -> dict[str, Any]:
    """{"classes": {Class: [members]}, "enums": {Enum: {MEMBER: value}}, "module": [names]} of a row."""
    out: dict[str, Any] = value(row_name, "python")
    return out


def trtexec_flags(row_name: str) -> list[str]:
    return list(value(row_name, "trtexec_flags"))


@dataclass(frozen=True)
class RowSummary:
    """The headline facts of one row (what the README's table and `doctor` print)."""

    row: str
    max_opset: Any
    layernorm_importer: Any
    fp16_dq_scales: Any
    strongly_typed: Any
    explicit_batch_flag: Any
    precision_flags: Any
    obey_precision_constraints: Any
    dla: Any
    build_only_flag: Any


def summary(row_name: str) -> RowSummary:
    v = lambda k: value(row_name, k)  # noqa: E731
    return RowSummary(row_name, v("max_opset"), v("layernorm_importer"), v("fp16_dq_scales"), v("strongly_typed"),
                      v("explicit_batch_flag"), bool(v("fp16_flag") and v("int8_flag")),
                      v("obey_precision_constraints"), v("dla"), v("trtexec_build_only"))
