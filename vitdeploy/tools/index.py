"""`vitdeploy index`: a gallery of embeddings as a FAISS index, chosen under a memory budget, its recall measured.

The choice follows autofaiss (criteo/autofaiss): exact ``Flat`` where it fits and a query over all of it stays fast;
else ``HNSW32`` where the graph fits; else an inverted file of 8-bit scalar-quantised vectors (``IVF…,SQ8``: a
quarter of the bytes, little lost); else product quantisation (``IVF…,PQm``) with the widest code that fits. Each
candidate that fits is built, its nprobe / efSearch raised until 10-recall@10 against exact search reaches the target
on held-out queries, and the first that reaches it is kept (else the one with the best recall, exit 3). The search
parameter is stored in the index (faiss writes nprobe and efSearch), so ``faiss.read_index`` answers as measured.

Recall is |approximate top-10 ∩ exact top-10| / 10, averaged over up to 1,000 of the vectors held out of the index
while it is measured (queries it does not contain), exact search being faiss.knn over the same normalised vectors;
the held-out vectors are added to the index afterwards, so the gallery holds every vector.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy.core.errors import PartlyDone, UsageError, VitdeployError
from vitdeploy.core.gallery import FORMAT, Lineage, import_faiss, import_pyarrow, sidecars

RECALL_K = 10
MAX_QUERIES = 1000  # held-out queries recall is measured on (autofaiss: 500)
MIN_QUERIES = 500
LATENCY_QUERIES = 200  # single queries timed for the median latency (at least 20, or as many as fit 2 s)
LATENCY_MIN_QUERIES = 20
LATENCY_SECONDS = 2.0
# a Flat query multiplies every vector: 2**25 multiply-adds (1M x 32-d, 260k x 128-d, 87k x 384-d) is about 5-10 ms
# on one core; past it an approximate index answers in a fraction of that
FLAT_MAX_MACS = 2**25
HNSW_M = 32
DEFAULT_MEMORY = "2GB"
DEFAULT_RECALL = 0.95


# --- sizes -----------------------------------------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str, option: str = "--memory") -> int:
    """'256MB' (10**6), '2GiB' (2**30), '1.5GB', '1000000' (bytes) → bytes; one line (exit 2) for anything else."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise UsageError(f"{option} {text!r}: give a size such as 256MB, 2GB or 1GiB")
    value = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value < 1 or value > 2**50:
        raise UsageError(f"{option} {text!r}: give a size from 1 byte to 1 PiB")
    return int(value)


def human(n: float) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{math.ceil(n / size * 10) / 10:g}{unit}"
    return f"{int(n)}B"


# --- the embeddings read -----------------------------------------------------------------------------------------------


@dataclass
class Embeddings:
    source: Path
    vectors: Any  # float32 [N, D] (a memory map for .npy)
    ids: Any  # int64 [N]
    paths: list[str] | None
    classes: list[str | None] | None  # per row
    model: dict[str, Any] = field(default_factory=dict)  # what the files say of the model (shard metadata)

    @property
    def n(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])


def _fixed_list_to_numpy(col: Any, where: str) -> Any:
    import numpy as np
    import pyarrow as pa

    arr = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    if pa.types.is_fixed_size_list(arr.type):
        width = arr.type.list_size
        flat = arr.flatten()
    elif pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        lengths = set(np.asarray(arr.value_lengths().fill_null(-1)).tolist())
        if len(lengths) > 1 or -1 in lengths:
            raise VitdeployError(f"{where}: the embedding column holds vectors of different lengths or nulls: write it "
                                 "again with vitdeploy infer")
        width = lengths.pop() if lengths else 0
        flat = arr.flatten()
    else:
        raise VitdeployError(f"{where}: the embedding column is {arr.type}, not a list of floats: write it with "
                             "vitdeploy infer -o DIR/ or -o FILE.parquet")
    if arr.null_count:
        raise VitdeployError(f"{where}: {arr.null_count} row(s) have no embedding: write it again with vitdeploy infer")
    return np.asarray(flat.to_numpy(zero_copy_only=False), np.float32).reshape(len(arr), width)


def _read_table(path: Path, what: str) -> tuple[Any, dict[str, Any]]:
    pq = import_pyarrow()
    try:
        t = pq.read_table(str(path))
        raw = (t.schema.metadata or {}).get(b"vitdeploy")
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file: one line naming it
        raise VitdeployError(f"{path}: not a readable Parquet file ({type(e).__name__}: {str(e)[:160]}): {what}") from None
    meta: dict[str, Any] = {}
    if raw:
        try:
            got = json.loads(raw.decode("utf-8"))
            meta = got if isinstance(got, dict) else {}
        except ValueError:
            raise VitdeployError(f"{path}: its `vitdeploy` metadata is not JSON: {what}") from None
    if "embedding" not in t.column_names:
        raise VitdeployError(f"{path}: no `embedding` column (columns: {', '.join(t.column_names)}): give an embedding "
                             "model's output (vitdeploy infer -m EMBEDDING_MODEL)")
    return t, meta


def _model_of(meta: dict[str, Any]) -> dict[str, Any]:
    """What shard metadata says of the model: its SHA-256 and, where recorded, the checkpoint (lineage root)."""
    out: dict[str, Any] = {}
    model = meta.get("model")
    for key in ("model_sha256", "sha256"):
        if isinstance(meta.get(key), str):
            out["sha256"] = meta[key]
    if isinstance(model, dict):
        for key in ("sha256", "checkpoint", "name", "path"):
            if isinstance(model.get(key), str):
                out[key] = model[key]
    elif isinstance(model, str) and len(model) == 64:
        out["sha256"] = model
    for key in ("checkpoint", "checkpoint_sha256", "root_sha256", "lineage_root"):
        if isinstance(meta.get(key), str):
            out["checkpoint"] = meta[key]
    return out


def read_embeddings(source: str | Path) -> Embeddings:
    """What infer writes: a folder of part-NNNNN.parquet shards (columns id, path, embedding[, class]; metadata
    `vitdeploy`), a .npy with its .files.txt, or a .parquet with `embedding` (and `path`, `id`, `class`) columns."""
    import numpy as np

    src = Path(source)
    if not src.exists():
        raise UsageError(f"{src}: no such file or folder: give infer's output (a shard folder, FILE.npy or FILE.parquet)")
    if src.is_dir():
        parts = sorted(src.glob("part-*.parquet"))
        if not parts:
            raise UsageError(f"{src}: no part-NNNNN.parquet shards in it: write them with `vitdeploy infer IMAGES -m "
                             f"MODEL -o {src}/`")
        vecs: list[Any] = []
        ids: list[Any] = []
        paths: list[Any] = []
        classes: list[Any] = []
        model: dict[str, Any] = {}
        for part in parts:
            t, meta = _read_table(part, f"re-run the infer command that wrote {src} (it re-makes a broken shard)")
            m = _model_of(meta)
            if model and m and m != model:
                raise VitdeployError(f"{part}: made by another model than {parts[0].name} ({m.get('sha256', '?')[:12]} "
                                     f"vs {model.get('sha256', '?')[:12]}): index shards of one model")
            model = model or m
            vecs.append(_fixed_list_to_numpy(t.column("embedding"), str(part)))
            ids.append(np.asarray(t.column("id").to_numpy(), np.int64) if "id" in t.column_names else None)
            paths += t.column("path").to_pylist() if "path" in t.column_names else [None] * t.num_rows
            classes += t.column("class").to_pylist() if "class" in t.column_names else [None] * t.num_rows
        vectors = np.concatenate(vecs) if vecs else np.zeros((0, 0), np.float32)
        id_arr: Any
        if all(i is not None for i in ids):
            id_arr = np.concatenate(ids)
        else:
            id_arr = np.arange(len(vectors), dtype=np.int64)
        return Embeddings(src, vectors, id_arr, [str(p) if p is not None else "" for p in paths],
                          classes if any(c is not None for c in classes) else None, model)
    suffix = src.suffix.lower()
    if suffix == ".npy":
        try:
            vectors = np.load(src, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as e:
            raise VitdeployError(f"{src}: not a numpy array file ({str(e)[:160]}): give infer's -o FILE.npy") from None
        if vectors.ndim != 2 or vectors.dtype.kind != "f":
            raise VitdeployError(f"{src}: holds a {vectors.dtype} array of shape {vectors.shape}, not [N, D] floats: "
                                 "give infer's -o FILE.npy of an embedding model")
        from vitdeploy.tools.infer import sidecar_of

        side = sidecar_of(src)
        npy_paths: list[str] | None = None
        if side.is_file():
            text = side.read_text(encoding="utf-8", errors="replace")
            npy_paths = text[:-1].split("\n") if text.endswith("\n") else text.split("\n") if text else []
            if len(npy_paths) != len(vectors):
                raise VitdeployError(f"{side}: names {len(npy_paths)} files for the {len(vectors)} rows of {src.name}: "
                                     "they are of different runs; write them again with vitdeploy infer")
        return Embeddings(src, vectors, np.arange(len(vectors), dtype=np.int64), npy_paths, None, {})
    if suffix == ".parquet":
        t, meta = _read_table(src, "write it again with vitdeploy infer")
        vectors = _fixed_list_to_numpy(t.column("embedding"), str(src))
        id_arr = np.asarray(t.column("id").to_numpy(), np.int64) if "id" in t.column_names else \
            np.arange(len(vectors), dtype=np.int64)
        pq_paths = [str(p) if p is not None else "" for p in t.column("path").to_pylist()] if "path" in t.column_names else None
        cls = t.column("class").to_pylist() if "class" in t.column_names else None
        return Embeddings(src, vectors, id_arr, pq_paths, cls, _model_of(meta))
    raise UsageError(f"{src}: give infer's output: a shard folder (-o DIR/), FILE.npy (with FILE.files.txt) or "
                     "FILE.parquet")


# --- the candidates --------------------------------------------------------------------------------------------------


@dataclass
class Candidate:
    key: str  # faiss index_factory key
    kind: str  # flat, hnsw, ivf-sq, ivf-pq
    bytes: int  # estimated size of the written index
    nlist: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "estimated_bytes": self.bytes}


def nlist_for(n: int) -> int:
    """Inverted lists: about sqrt(N), a power of two, with at least 39 training vectors each (faiss's floor)."""
    k = 2 ** max(0, round(math.log2(max(1.0, math.sqrt(n)))))
    while k > 1 and n < 39 * k:
        k //= 2
    return k


def candidates(n: int, d: int, flat_max_macs: int = FLAT_MAX_MACS) -> list[Candidate]:
    """Every index kind for N vectors of D dims, most exact first, with its estimated bytes (vectors, graph, ids,
    centroids), autofaiss's order."""
    ids = 8 * n  # IndexIDMap / the inverted lists' ids
    out: list[Candidate] = []
    if n * d <= flat_max_macs:
        out.append(Candidate("Flat", "flat", 4 * n * d + ids + 4096))
    out.append(Candidate(f"HNSW{HNSW_M},Flat", "hnsw", n * (4 * d + 4 * (2 * HNSW_M + 1) + 12) + ids + 4096))
    nl = nlist_for(n)
    if n >= 39:  # an inverted file needs vectors to train on
        cent = 4 * nl * d + 32 * nl + 4096  # centroids, each list's header, the file's
        out.append(Candidate(f"IVF{nl},SQ8", "ivf-sq", n * d + ids + cent + 8 * d, nl))
        for m in sorted((m for m in (64, 48, 32, 24, 16, 12, 8, 4, 2, 1) if d % m == 0 and m < d), reverse=True):
            out.append(Candidate(f"IVF{nl},PQ{m}", "ivf-pq", n * m + ids + cent + 4 * 256 * d, nl))
    return out


def pick(n: int, d: int, budget: int, flat_max_macs: int = FLAT_MAX_MACS) -> list[Candidate]:
    """The candidates that fit ``budget``, most exact first; none: one line (exit 2) naming the least that works."""
    allc = candidates(n, d, flat_max_macs)
    fit = [c for c in allc if c.bytes <= budget]
    if not fit:
        least = min(allc, key=lambda c: c.bytes)
        raise UsageError(f"--memory {human(budget)}: below any index of {n} {d}-d vectors; the least that works is "
                         f"{least.key}, about {human(least.bytes)}: pass --memory {human(least.bytes)} or more")
    return fit


# --- build, tune, measure ----------------------------------------------------------------------------------------------


def recall_at(approx: Any, exact: Any, k: int = RECALL_K) -> float:
    """10-recall@10: |approximate top-k ∩ exact top-k| / k, averaged over the queries."""
    hits = [len(set(a[:k].tolist()) & set(e[:k].tolist())) for a, e in zip(approx, exact, strict=True)]
    return float(sum(hits)) / (k * len(hits)) if hits else 0.0


def _set_param(index: Any, kind: str, value: int) -> None:
    import faiss

    inner: Any = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    if kind == "hnsw":
        inner.hnsw.efSearch = int(value)
    elif kind.startswith("ivf"):
        faiss.extract_index_ivf(inner).nprobe = int(value)


def _param_values(c: Candidate) -> list[int]:
    if c.kind == "hnsw":
        return [16, 32, 64, 128, 256, 512, 1024]
    if c.kind.startswith("ivf"):
        vals = [v for v in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if v < c.nlist] + [c.nlist]
        return sorted(set(vals))
    return [0]


@dataclass
class Built:
    candidate: Candidate
    index: Any
    recall: float
    param: int
    seconds: float
    tried: list[dict[str, Any]]


def build_one(c: Candidate, base: Any, base_ids: Any, queries: Any, exact: Any, target: float, seed: int,
              say: Callable[[str], None]) -> Built:
    """Build ``c`` on the base vectors, then raise its search parameter until recall reaches the target."""
    import faiss
    import numpy as np

    t0 = time.perf_counter()
    d = base.shape[1]
    index: Any
    if c.kind in ("flat", "hnsw"):
        index = faiss.IndexIDMap(faiss.index_factory(d, c.key, faiss.METRIC_INNER_PRODUCT))
    else:
        index = faiss.index_factory(d, c.key, faiss.METRIC_INNER_PRODUCT)
        ivf = faiss.extract_index_ivf(index)
        ivf.cp.niter = 10
        ivf.cp.seed = seed
        n_train = min(len(base), max(64 * c.nlist, 39 * 256 if c.kind == "ivf-pq" else 0))
        if c.kind == "ivf-pq":
            pq_index: Any = faiss.downcast_index(index)
            pq_index.pq.cp.min_points_per_centroid = 1  # 256 codes: fewer than 39 vectors a code is what there is
            pq_index.do_polysemous_training = False  # the factory's default: an annealing of minutes, for Hamming filters not used here
        rng = np.random.default_rng(seed)
        sample = base[np.sort(rng.choice(len(base), n_train, replace=False))] if n_train < len(base) else base
        say(f"training {c.key} on {n_train} vectors")
        index.train(np.ascontiguousarray(sample, np.float32))
    say(f"adding {len(base)} vectors to {c.key}")
    step = 1 << 18
    for s in range(0, len(base), step):
        index.add_with_ids(np.ascontiguousarray(base[s : s + step], np.float32), base_ids[s : s + step])
    seconds = time.perf_counter() - t0
    tried = []
    best = (-1.0, 0)
    for v in _param_values(c):
        _set_param(index, c.kind, v)
        _, got = index.search(queries, RECALL_K)
        r = recall_at(got, exact)
        tried.append({"param": v, "recall_at_10": round(r, 4)})
        if r > best[0]:
            best = (r, v)
        if r >= target:
            best = (r, v)
            break
    _set_param(index, c.kind, best[1])
    return Built(c, index, best[0], best[1], seconds, tried)


def median_latency_ms(index: Any, queries: Any, n: int = LATENCY_QUERIES) -> float:
    import numpy as np

    times: list[float] = []
    for q in queries[:n]:
        t0 = time.perf_counter()
        index.search(q[None, :], RECALL_K)
        times.append(time.perf_counter() - t0)
        if len(times) >= LATENCY_MIN_QUERIES and sum(times) > LATENCY_SECONDS:  # a slow index: enough to say
            break
    return float(np.median(times) * 1000.0) if times else 0.0


@dataclass
class IndexResult:
    out: Path
    files: list[Path]
    meta: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def normalised(x: Any) -> Any:
    import numpy as np

    v = np.asarray(x, np.float32)
    n = np.linalg.norm(v, axis=1, keepdims=True)
    return np.ascontiguousarray(v / np.where(n > 0, n, 1.0), np.float32)


def build_index(
    embeddings: str | Path | Embeddings,
    out: str | Path,
    memory: str | int = DEFAULT_MEMORY,
    recall: float = DEFAULT_RECALL,
    model: str | Path | None = None,
    classes_from_folders: bool = False,
    threads: int | None = None,
    seed: int = 0,
    say: Callable[[str], None] = lambda s: None,
    flat_max_macs: int = FLAT_MAX_MACS,
) -> IndexResult:
    """Read infer's embeddings, choose the index for the memory budget, build it, tune and measure its recall, and
    write ``out`` (.faiss) with gallery.json and gallery.ids.parquet beside it (each atomically)."""
    import numpy as np

    from vitdeploy.core.fileio import atomic_path, printable_name, write_json_atomic
    from vitdeploy.core.host import available_cores

    budget = memory if isinstance(memory, int) else parse_bytes(memory)
    if not (0.0 < recall <= 1.0):
        raise UsageError(f"--recall {recall}: give a fraction above 0 and at most 1 (e.g. 0.95)")
    faiss = import_faiss()
    emb = embeddings if isinstance(embeddings, Embeddings) else read_embeddings(embeddings)
    n, d = emb.n, emb.dim
    if n < 1 or d < 1:
        raise VitdeployError(f"{emb.source}: holds no vectors: give infer's output of at least one image")
    fits = pick(n, d, budget, flat_max_macs)  # before the vectors are normalised: a budget below any is exit 2 at once
    if len(np.unique(emb.ids)) != n:
        raise VitdeployError(f"{emb.source}: its ids repeat (rows with the same `id`): each image once, as infer writes")
    lineage = _lineage(emb, model, d)
    classes_col = emb.classes
    if classes_from_folders:
        if emb.paths is None:
            raise UsageError(f"--classes-from-folders: {emb.source} names no files (no path column or .files.txt)")
        classes_col = [Path(p).parent.name or None for p in emb.paths]
    x = normalised(emb.vectors)
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        name = f" ({emb.paths[i]})" if emb.paths else ""
        raise VitdeployError(f"{emb.source}: row {i}{name} holds NaN or Inf: embed that image again, or drop it")
    cores = available_cores()
    t = threads or cores
    faiss.omp_set_num_threads(t)
    rng = np.random.default_rng(seed)
    n_q = min(MAX_QUERIES, n // 2)
    held = np.sort(rng.choice(n, n_q, replace=False)) if n_q else np.zeros(0, np.int64)
    keep = np.ones(n, bool)
    keep[held] = False
    base, base_ids = x[keep], emb.ids[keep]
    queries = np.ascontiguousarray(x[held])
    notes: list[str] = []
    if n_q < MIN_QUERIES:
        notes.append(f"recall measured on {n_q} held-out queries (fewer than {MIN_QUERIES}: the gallery has {n} vectors)")
    exact = faiss.knn(queries, base, min(RECALL_K, len(base)), metric=faiss.METRIC_INNER_PRODUCT)[1] if n_q else None
    exact_ids = base_ids[exact] if exact is not None else None
    best: Built | None = None
    tried: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    for c in fits:
        if n_q == 0:  # one vector: nothing to hold out; Flat is exact
            built = build_one(c, base, base_ids, queries, np.zeros((0, RECALL_K), np.int64), recall, seed, say)
            built.recall = 1.0
        else:
            say(f"building {c.key} (about {human(c.bytes)})")
            built = build_one(c, base, base_ids, queries, exact_ids, recall, seed, say)
        size = len(faiss.serialize_index(built.index))
        size += math.ceil(size / max(1, len(base)) * n_q)  # with the held-out vectors added back, about
        tried.append({**c.to_dict(), "build_seconds": round(built.seconds, 2), "recall_at_10": round(built.recall, 4),
                      "param": built.param, "tuning": built.tried, "bytes_before_held_out": size})
        if size > budget:
            notes.append(f"{c.key} came to {human(size)}, over --memory {human(budget)}: next")
            continue
        if best is None or built.recall > best.recall:
            best = built
        if built.recall >= recall:
            break
        notes.append(f"{c.key} reached 10-recall@10 {built.recall:.4f} at most, below --recall {recall}: next")
    if best is None:
        raise VitdeployError(f"no index of {n} {d}-d vectors came within --memory {human(budget)}: pass more memory")
    index, c = best.index, best.candidate
    if n_q:
        index.add_with_ids(queries, emb.ids[held])  # the gallery holds every vector
    latency = median_latency_ms(index, queries if n_q else x[:1])
    data = faiss.serialize_index(index)
    if len(data) > budget:
        raise VitdeployError(f"{c.key} with all {n} vectors came to {human(len(data))}, over --memory {human(budget)}: "
                             f"pass --memory {human(len(data))} or more")
    names = sorted({str(v) for v in (classes_col or []) if v is not None})
    param_name = {"hnsw": "efSearch", "ivf-sq": "nprobe", "ivf-pq": "nprobe"}.get(c.kind)
    o = Path(out)
    side, ids_file = sidecars(o)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "index": o.name,
        "key": c.key,
        "kind": c.kind,
        "metric": "inner product of L2-normalised vectors (cosine)",
        "n": n,
        "dim": d,
        "bytes": len(data),
        "memory_budget": budget,
        "recall_target": recall,
        "recall_at_10": round(best.recall, 6),
        "recall_queries": n_q,
        "recall_note": (f"10-recall@10 = |approximate top-10 ∩ exact top-10| / 10 on {n_q} vectors held out of the "
                        "index while measured (added to it afterwards); exact: faiss.knn over the same vectors"),
        "search": {param_name: best.param} if param_name else {},
        "latency_ms_median": round(latency, 4),  # of up to 200 single queries (at least 20, or 2 s of them)
        "latency_threads": t,
        "build_seconds": round(time.perf_counter() - t_all, 2),
        **lineage.to_dict(),
        "model": emb.model or ({"path": str(model)} if model else {}),
        "source": printable_name(emb.source),
        "classes": names,
        "ids": ids_file.name,
        "tried": tried,
        "versions": {"faiss": getattr(faiss, "__version__", "?")},
    }
    with atomic_path(o) as tmp:
        tmp.write_bytes(np.asarray(data).tobytes())
    pq = import_pyarrow()
    import pyarrow as pa

    cols: dict[str, Any] = {"id": pa.array(emb.ids, pa.int64())}
    cols["path"] = pa.array(emb.paths if emb.paths is not None else [None] * n, pa.string())
    cols["class"] = pa.array([None if v is None else str(v) for v in classes_col] if classes_col else [None] * n,
                             pa.string())
    with atomic_path(ids_file) as tmp:
        pq.write_table(pa.table(cols), str(tmp))
    write_json_atomic(side, meta)
    if best.recall < recall:
        raise PartlyDone(f"{o} written, but its 10-recall@10 is {best.recall:.4f}, below --recall {recall} (no index "
                         f"within --memory {human(budget)} reaches it): pass more --memory")
    return IndexResult(o, [o, side, ids_file], meta, notes)


def _lineage(emb: Embeddings, model: str | Path | None, dim: int) -> Lineage:
    """The checkpoint the vectors came from: the shards' metadata, else --model's lineage (checked for width)."""
    from vitdeploy.core.gallery import lineage_of

    recorded = Lineage(emb.model.get("checkpoint"), tuple(s for s in (emb.model.get("sha256"),) if s))
    if model is None:
        return recorded
    from vitdeploy.core.fileio import sha256_file
    from vitdeploy.core.task import task_of
    from vitdeploy.model.importers import read_any_manifest

    p = Path(model)
    if not p.exists():
        raise UsageError(f"--model {p}: no such file; pass the model the embeddings were made with")
    try:
        m = read_any_manifest(p)
    except (VitdeployError, OSError, ValueError) as e:
        raise UsageError(f"--model {p}: {e}") from None
    task = task_of(m)
    if not task.is_embedding or task.dim != dim:
        what = f"a {task.dim}-d embedding model" if task.is_embedding else f"a {task.describe()}"
        raise UsageError(f"--model {p} is {what}; the embeddings are {dim}-d: pass the model that made them")
    lin = lineage_of(p, m, sha256_file(p) if p.is_file() else None)
    if (recorded.checkpoint or recorded.shas) and not lin.same_model(recorded):
        raise UsageError(f"--model {p} is not the model {emb.source} records ({(recorded.shas or ('?',))[0][:12]}): "
                         "pass the model that made them")
    return lin
