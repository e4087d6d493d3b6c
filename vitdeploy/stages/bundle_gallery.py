"""``bundle --gallery gallery.faiss``: the gallery shipped beside the model, for run.py's kNN labels on the device.

numpy cannot read a FAISS file and run.py promises numpy only, so the bundle carries the index's vectors
(``gallery/vectors.npy``, float16, L2-normalised, in id order: exact for a Flat or HNSW index, decoded for IVF-SQ8/PQ)
and their classes (``gallery/classes.npy``, an index into ``bundle.gallery.names``), up to core/limits'
GALLERY_BYTES_MAX (1M x 128-d). The reference images' kNN labels are computed here by run.py's own function
(``knn_labels``, loaded from the file the bundle ships) from each precision's reference embeddings, so that
``run.py --check`` compares like with like.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from vitdeploy.core.errors import UsageError
from vitdeploy.core.gallery import IndexGallery, import_faiss, lineage_of, open_gallery, read_meta
from vitdeploy.core.limits import GALLERY_BYTES_MAX


def check_gallery_size(index: str | Path) -> None:
    """Before any work: the index exists, has classes, and its vectors fit the ceiling as float16 (one line, exit 2)."""
    p = Path(index)
    if not p.is_file():
        raise UsageError(f"--gallery {p}: no such file; build one with `vitdeploy index EMBEDDINGS -o {p}`")
    meta = read_meta(p)
    size = int(meta["n"]) * int(meta["dim"]) * 2
    if size > GALLERY_BYTES_MAX:
        raise UsageError(f"--gallery {p}: {meta['n']} x {meta['dim']}-d vectors are {size / 1e6:.0f} MB as float16, more "
                         f"than the {GALLERY_BYTES_MAX / 1e6:.0f} MB (1M x 128-d) a bundle ships for run.py's exact "
                         "search: index fewer vectors, or query the index on a host with `vitdeploy infer --gallery`")
    if not meta.get("classes"):
        raise UsageError(f"--gallery {p}: its vectors have no classes to vote with: build it from an ImageFolder's "
                         "embeddings (a `class` column, or `vitdeploy index EMB --classes-from-folders`)")


def run_py_module() -> ModuleType:
    """The run.py the bundle ships, loaded as a module (its knn_labels is the one the device runs)."""
    path = Path(__file__).resolve().parent / "bundle_files" / "run.py"
    spec = importlib.util.spec_from_file_location("vitdeploy_bundle_run_py", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gallery_vectors(g: IndexGallery) -> np.ndarray:
    """The index's vectors in the order of ``g.ids`` (float32, L2-normalised)."""
    faiss = import_faiss()
    index = g.index
    if isinstance(index, faiss.IndexIDMap):
        inner = faiss.downcast_index(index.index)
        order = faiss.vector_to_array(index.id_map).astype(np.int64)
        x = inner.reconstruct_n(0, inner.ntotal)
        pos = np.argsort(order, kind="stable")  # g.ids is sorted: the same order
        x = x[pos]
    else:
        ivf = faiss.extract_index_ivf(index)
        ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
        x = np.concatenate([index.reconstruct_batch(g.ids[s : s + 65536]) for s in range(0, len(g.ids), 65536)])
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.asarray(x / np.where(n > 0, n, 1.0), np.float32)


def check_bundle_gallery(index: str | Path, model: Path, manifest: Any, model_sha256: str) -> None:
    """Before the bundle's work: an embedding model, and an index of its checkpoint and width (one line, exit 2)."""
    from vitdeploy.core.gallery import check_query_model
    from vitdeploy.core.task import task_of

    task = task_of(manifest)
    if not task.is_embedding:
        raise UsageError(f"--gallery ships an embedding model's gallery; {model.name} is a {task.describe()} and labels "
                         "images itself: drop --gallery")
    check_gallery_size(index)
    check_query_model(open_gallery(index), lineage_of(model, manifest, model_sha256), int(task.dim), model.name)


def ship_gallery(root: Path, index: str | Path, model: Path, manifest: Any, model_sha256: str,
                 reference: dict[str, np.ndarray]) -> dict[str, Any]:
    """Write gallery/ into the bundle folder ``root`` and return manifest.json's ``bundle.gallery`` entry; refuse an
    index of another checkpoint or width (one line) before writing."""
    from vitdeploy.core.gallery import check_query_model
    from vitdeploy.core.task import task_of

    check_gallery_size(index)
    g = open_gallery(index)
    check_query_model(g, lineage_of(model, manifest, model_sha256), int(task_of(manifest).dim), model.name)
    has_class = g.class_index >= 0  # a vector of no class never votes: not shipped
    x = gallery_vectors(g)[has_class]
    cls = g.class_index[has_class]
    (root / "gallery").mkdir(exist_ok=True)
    rel_v, rel_c = "gallery/vectors.npy", "gallery/classes.npy"
    np.save(root / rel_v, x.astype(np.float16))
    np.save(root / rel_c, cls.astype(np.int32))
    run_py = run_py_module()
    k, temp = 20, 0.07  # checks/metrics KNN_K, KNN_T (DINOv2's eval/knn.py)
    vectors = np.load(root / rel_v, mmap_mode="r")
    labels = {prec: [g.classes[i] for i in run_py.knn_labels(vectors, cls, len(g.classes), emb, k, temp)[0]]
              for prec, emb in reference.items()}
    sha = {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in (rel_v, rel_c)}
    return {"vectors": rel_v, "classes": rel_c, "names": g.classes, "k": k, "temperature": temp, "sha256": sha,
            "n": int(len(cls)), "dim": g.dim, "reference_labels": labels,
            "index": {"file": g.path.name, "key": g.meta.get("key"), "recall_at_10": g.meta.get("recall_at_10"),
                      "checkpoint": g.meta.get("checkpoint")},
            "why": "run.py labels images by the exact kNN vote over these vectors (numpy only: it cannot read FAISS)"}
