"""The sink: one Parquet shard per partition, ``DIR/part-NNNNN.parquet``, written whole or not at all, and
``DIR/errors.parquet`` (path, reason) for the files that could not be read.

Each shard carries key-value metadata ``vitdeploy``: a JSON object naming the model (the artifact's SHA-256 and its
checkpoint's, the lineage root), the partition (index, ids, source hash over paths, sizes and mtimes), rows, the
files skipped (with reasons, so errors.parquet is rebuilt on a resume without reading an image again), the Ray node
and host that made it, and seconds. A shard whose footer cannot be read (a crash mid-write of a copy made by other
means; ours are renamed into place) is never taken as finished. The sink does not know which executor ran.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitdeploy.core.fileio import atomic_path
from vitdeploy.tools.corpus.deps import need

META_KEY = b"vitdeploy"
SHARD_RE = re.compile(r"^part-(\d{5,})\.parquet$")
ERRORS_NAME = "errors.parquet"
FORMAT = "vitdeploy-shard/1"


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


@dataclass
class ShardRows:
    """One partition's answers, in id order: what a shard holds."""

    ids: list[int]
    paths: list[str]
    classes: list[str | None] | None  # an ImageFolder's class per row, else None
    outputs: dict[str, Any]  # "embedding": float32 [n, d]; or label, score, label_i, score_i
    skipped: list[tuple[str, str]]  # (path, reason)


def table_of(rows: ShardRows, dim: int | None) -> Any:
    """The Arrow table of a shard: id int64, path, [class], then the model's columns (an embedding as a fixed-size
    list of float32, so a reader gets an [n, d] array without copying lists)."""
    import numpy as np

    pa = need("pyarrow")
    cols: dict[str, Any] = {"id": pa.array(rows.ids, pa.int64()), "path": pa.array(rows.paths, pa.string())}
    if rows.classes is not None:
        cols["class"] = pa.array(rows.classes, pa.string())
    for name, value in rows.outputs.items():
        if name == "embedding":
            v = np.ascontiguousarray(value, np.float32).reshape(len(rows.ids), -1)
            d = v.shape[1] if v.size else int(dim or 0)
            cols[name] = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1), pa.float32()), d)
        elif name.startswith("score"):
            cols[name] = pa.array(np.asarray(value, np.float32), pa.float32())
        else:
            cols[name] = pa.array(list(value), pa.string())
    return pa.table(cols)


def write_shard(folder: Path, index: int, table: Any, meta: dict[str, Any]) -> Path:
    """``folder/part-NNNNN.parquet``, written to a temporary file beside it and renamed into place."""
    pq = need("pyarrow.parquet")
    path = folder / shard_name(index)
    doc = {"format": FORMAT, **meta}
    table = table.replace_schema_metadata({META_KEY: json.dumps(doc, allow_nan=False).encode()})
    if path.is_symlink():  # a link where a shard goes is replaced itself, never written through
        path.unlink()
    with atomic_path(path) as tmp:
        pq.write_table(table, str(tmp))
    return path


def read_meta(path: Path) -> dict[str, Any] | None:
    """A shard's ``vitdeploy`` metadata, read from its footer alone; None when the file is not a whole Parquet file
    of ours (truncated, another tool's, another format)."""
    pq = need("pyarrow.parquet")
    try:
        md = pq.read_schema(str(path)).metadata or {}
        doc = json.loads(md[META_KEY])
    except Exception:  # noqa: BLE001 - any unreadable footer means: not finished
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    try:  # the footer may be whole while the row groups are not (bytes cut out of the middle): count them
        if pq.ParquetFile(str(path)).metadata.num_rows != doc.get("rows"):
            return None
    except Exception:  # noqa: BLE001
        return None
    return doc


def existing_shards(folder: Path) -> dict[int, Path]:
    """The shard files in ``folder`` by partition index."""
    out: dict[int, Path] = {}
    if not folder.is_dir():
        return out
    for p in folder.iterdir():
        m = SHARD_RE.match(p.name)
        if m and p.is_file() and not p.is_symlink():
            out[int(m.group(1))] = p
    return out


def write_errors(folder: Path, errors: list[tuple[str, str]]) -> Path:
    """``errors.parquet``: one row per file that could not be read (path, reason), in id order; written on every run,
    empty when none, so a resumed run never leaves an earlier run's list."""
    pa = need("pyarrow")
    pq = need("pyarrow.parquet")
    path = folder / ERRORS_NAME
    table = pa.table({"path": pa.array([p for p, _ in errors], pa.string()),
                      "reason": pa.array([r for _, r in errors], pa.string())})
    with atomic_path(path) as tmp:
        pq.write_table(table, str(tmp))
    return path
