"""A gallery as a FAISS index (``vitdeploy index``): its files, the model it belongs to, and how it is queried.

A gallery of a million images cannot be re-embedded and compared whole on every call, as ``infer --gallery DIR``
does; ``vitdeploy index`` (tools/index.py) builds it once into ``gallery.faiss`` (readable by ``faiss.read_index``)
with two sidecars beside it:

- ``gallery.json``: the index key, N, D, bytes, the recall measured against exact search, the search parameters,
  the median query latency, the classes, and the checkpoint the vectors came from (the lineage root's SHA-256);
- ``gallery.ids.parquet``: each vector's id (the faiss label) with its path and class.

Cosine similarity is the inner product of L2-normalised vectors, so the index answers what the exact kNN of
checks/metrics answers. This module is here (core), not in tools, because the bundle stage reads a gallery too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy.core.errors import UsageError, VitdeployError

FORMAT = "vitdeploy-gallery/1"
SUFFIX = ".faiss"


def import_faiss() -> Any:
    """faiss, or one line saying how to install it (a `scale` extra: it is never needed elsewhere)."""
    try:
        import faiss
    except ImportError:
        raise VitdeployError("faiss is not installed: pip install 'vitdeploy[scale]' (or pip install faiss-cpu)") from None
    return faiss


def import_pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise VitdeployError("pyarrow is not installed: pip install 'vitdeploy[scale]' (or pip install pyarrow)") from None
    return pq


def is_index_file(path: str | Path | None) -> bool:
    """Whether ``--gallery`` names an index (a .faiss file) rather than a labelled folder."""
    return path is not None and Path(path).suffix.lower() == SUFFIX and not Path(path).is_dir()


def sidecars(index: str | Path) -> tuple[Path, Path]:
    """gallery.faiss → (gallery.json, gallery.ids.parquet)."""
    p = Path(index)
    stem = p.name[: -len(p.suffix)] if p.suffix else p.name
    return p.with_name(stem + ".json"), p.with_name(stem + ".ids.parquet")


# --- which checkpoint a model comes from ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Lineage:
    """The checkpoint an artifact descends from (the root's SHA-256, None where the chain breaks: a model.onnx that
    is no longer beside its model.int8.onnx) and every SHA-256 known along the way (its own first, where known)."""

    checkpoint: str | None
    shas: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "lineage": list(self.shas)}

    def same_model(self, other: Lineage) -> bool:
        """The two chains share an artifact: the same checkpoint, or (where one chain breaks before its root, and
        names the deepest SHA-256 it knows) an artifact of the other's chain. Two checkpoints never share one."""
        if self.checkpoint and other.checkpoint and self.checkpoint == other.checkpoint:
            return True
        mine = set(self.shas) | ({self.checkpoint} if self.checkpoint else set())
        theirs = set(other.shas) | ({other.checkpoint} if other.checkpoint else set())
        return bool(mine & theirs)


def lineage_of(path: str | Path, manifest: Any, own_sha256: str | None = None) -> Lineage:
    """The checkpoint ``path`` descends from, as core/lineage.checkpoint_root walks it (the one walk the corpus's shard
    records are made by too, so an index and its shards name one checkpoint alike)."""
    from vitdeploy.core.lineage import checkpoint_root

    root = checkpoint_root(path, manifest, own_sha256)
    return Lineage(root.checkpoint, root.shas)


# --- an index gallery, opened --------------------------------------------------------------------------------------


@dataclass
class IndexGallery:
    path: Path
    index: Any
    meta: dict[str, Any]
    ids: Any  # int64 [N], sorted
    class_index: Any  # int64 [N]: the class of ids[i] (index into classes), -1 where unknown
    classes: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # in the order of ids

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    @property
    def size(self) -> int:
        return int(self.meta["n"])

    @property
    def lineage(self) -> Lineage:
        return Lineage(self.meta.get("checkpoint"), tuple(self.meta.get("lineage") or ()))

    def rows_of(self, labels: Any) -> Any:
        """Positions (into ids/class_index/paths) of faiss labels; -1 for faiss's 'no neighbour' (-1)."""
        import numpy as np

        lab = np.asarray(labels, np.int64)
        pos = np.searchsorted(self.ids, lab)
        pos = np.clip(pos, 0, len(self.ids) - 1)
        found = self.ids[pos] == lab
        return np.where(found & (lab >= 0), pos, -1)


def read_meta(index: str | Path) -> dict[str, Any]:
    side, _ = sidecars(index)
    if not side.is_file():
        raise VitdeployError(f"{index}: no {side.name} beside it (the index's sidecar): build it with "
                             f"`vitdeploy index EMBEDDINGS -o {index}`")
    from vitdeploy.core.fileio import NotAFileOfBoundedSize, read_bounded
    from vitdeploy.core.limits import bounds

    try:
        meta = json.loads(read_bounded(side, int(bounds("text_file_bytes")["max"])).decode("utf-8"))
    except (OSError, ValueError, NotAFileOfBoundedSize) as e:
        raise VitdeployError(f"{side}: not a readable gallery sidecar ({e}): build the index again with "
                             "`vitdeploy index`") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise VitdeployError(f"{side}: format is {meta.get('format') if isinstance(meta, dict) else None!r}, not "
                             f"{FORMAT}: build the index again with `vitdeploy index`")
    for key in ("n", "dim", "classes"):
        if key not in meta:
            raise VitdeployError(f"{side}: no field {key!r}: build the index again with `vitdeploy index`")
    return meta


def open_gallery(index: str | Path, option: str = "--gallery") -> IndexGallery:
    """The index, its sidecar and its ids file, each checked against the others (one line naming the file)."""
    import numpy as np

    p = Path(index)
    if not p.is_file():
        raise UsageError(f"{option} {p}: no such file; build one with `vitdeploy index EMBEDDINGS -o {p}`")
    meta = read_meta(p)
    faiss = import_faiss()
    try:
        idx = faiss.read_index(str(p))
    except RuntimeError as e:
        raise VitdeployError(f"{p}: not a readable FAISS index ({str(e).strip().splitlines()[-1][:200]}): build it "
                             "again with `vitdeploy index`") from None
    if idx.d != int(meta["dim"]) or idx.ntotal != int(meta["n"]):
        raise VitdeployError(f"{p}: holds {idx.ntotal} {idx.d}-d vectors, its sidecar says {meta['n']} {meta['dim']}-d: "
                             "the files are of different builds; build the index again with `vitdeploy index`")
    _, ids_file = sidecars(p)
    if not ids_file.is_file():
        raise VitdeployError(f"{p}: no {ids_file.name} beside it (its ids, paths and classes): build it again with "
                             "`vitdeploy index`")
    pq = import_pyarrow()
    try:
        t = pq.read_table(str(ids_file))
        ids = np.asarray(t.column("id").to_numpy(), np.int64)
        classes = [str(c) for c in meta.get("classes") or []]
        where = {c: i for i, c in enumerate(classes)}
        cls = t.column("class").to_pylist() if "class" in t.column_names else [None] * len(ids)
        paths = [str(x) if x is not None else "" for x in t.column("path").to_pylist()] if "path" in t.column_names \
            else [""] * len(ids)
    except Exception as e:  # noqa: BLE001 - pyarrow's errors have many types: one line naming the file
        raise VitdeployError(f"{ids_file}: not a readable ids file ({type(e).__name__}: {str(e)[:200]}): build the "
                             "index again with `vitdeploy index`") from None
    if len(ids) != idx.ntotal:
        raise VitdeployError(f"{ids_file}: {len(ids)} ids for {idx.ntotal} vectors in {p.name}: build the index again")
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    ci = np.asarray([where.get(c, -1) if c is not None else -1 for c in cls], np.int64)[order]
    return IndexGallery(p, idx, meta, ids, ci, classes, [paths[i] for i in order])


def check_query_model(g: IndexGallery, lineage: Lineage, dim: int, model: str | Path) -> None:
    """Refuse, in one line before any image is read, a model that cannot query this index: another width, another
    checkpoint (any precision of the same checkpoint may), or an index whose vectors have no classes to vote."""
    if dim != g.dim:
        raise UsageError(f"--gallery {g.path}: holds {g.dim}-d vectors, {model} gives {dim}-d ones: query it with the "
                         "model it was built from, or build an index from this model's embeddings")
    if not g.classes or (g.class_index < 0).all():
        raise UsageError(f"--gallery {g.path}: its vectors have no classes to vote with: build it from infer's shards "
                         "of an ImageFolder (a `class` column), or with `vitdeploy index EMB --classes-from-folders`")
    mine = g.lineage
    if not mine.checkpoint and not mine.shas:
        raise UsageError(f"--gallery {g.path}: records no model its vectors came from: build it again with "
                         "`vitdeploy index EMB --model MODEL -o ...`")
    if not lineage.same_model(mine):
        have = (lineage.checkpoint or (lineage.shas[0] if lineage.shas else "?"))[:12]
        raise UsageError(f"--gallery {g.path}: built from the embeddings of checkpoint {(mine.checkpoint or '?')[:12]}, "
                         f"{model} comes from {have}: query it with a model of that checkpoint (any precision), or "
                         "build an index with this model's embeddings")


def search(g: IndexGallery, queries: Any, k: int) -> tuple[Any, Any]:
    """(rows into g.ids, cosines) of each query's k nearest gallery vectors, best first; -1 / -inf where fewer."""
    import numpy as np

    q = np.asarray(queries, np.float32)
    n = np.linalg.norm(q, axis=1, keepdims=True)
    q = np.ascontiguousarray(q / np.where(n > 0, n, 1.0), np.float32)
    sims, labels = g.index.search(q, int(k))
    rows = g.rows_of(labels)
    sims = np.where(rows >= 0, sims.astype(np.float64), -np.inf)
    return rows, sims
