"""``infer SOURCE -m MODEL -o DIR/``: a corpus into a folder of Parquet shards, in-process or on Ray, resumable.

The run plans before it works: the source is listed and cut, the shards already in DIR are read by their footers,
and each partition is kept (its model and its source hash match), made again, or made; a shard that matches no
partition any more is removed and named. Shards of another checkpoint are refused before anything is touched. Then
the executor runs the partitions to do, and the sink writes each shard as it completes; the driver holds only the
partitions in flight. errors.parquet is written last, from every shard's metadata, so a resumed run lists the
unreadable files of the shards it kept too.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.fileio import check_output
from vitdeploy.tools.corpus.batch import ShardBuilder, output_names
from vitdeploy.tools.corpus.deps import need
from vitdeploy.tools.corpus.identity import ModelId, model_id
from vitdeploy.tools.corpus.sink import ERRORS_NAME, existing_shards, read_meta, table_of, write_errors, write_shard
from vitdeploy.tools.corpus.source import Listing, Partition, partitions, read_source, source_hash

DEFAULT_SHARD_SIZE = 10_000

Progress = Callable[[int, int, int], None]  # (done, skipped, total)


@dataclass
class CorpusResult:
    folder: Path
    model: Path
    backend: str
    precision: str
    executor: str  # "in-process" or "ray"
    shards: int = 0
    made: int = 0
    kept: int = 0
    removed: list[str] = field(default_factory=list)
    rows: int = 0  # rows in all shards
    images_run: int = 0  # images read by this run (not those of kept shards)
    errors: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    nodes: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    @property
    def images_per_second(self) -> float:
        return self.images_run / self.seconds if self.seconds > 0 else 0.0

    @property
    def errors_path(self) -> Path:
        return self.folder / ERRORS_NAME

    def to_dict(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "model": str(self.model), "backend": self.backend,
                "precision": self.precision, "executor": self.executor, "shards": self.shards, "made": self.made,
                "kept": self.kept, "removed": self.removed, "rows": self.rows, "images_run": self.images_run,
                "images_per_second": self.images_per_second, "seconds": self.seconds,
                "errors": len(self.errors), "errors_file": str(self.errors_path), "nodes": sorted(self.nodes)}


@dataclass
class Plan:
    parts: list[Partition]
    todo: list[Partition]
    kept: dict[int, dict[str, Any]]  # partition index -> the kept shard's metadata
    remove: list[Path]
    notes: list[str]


def settings(manifest: Any, top_k: int) -> dict[str, Any]:
    """What besides the model and the images decides a shard's columns (a changed --top-k makes them again)."""
    return {"columns": output_names(manifest, top_k)}


def plan(folder: Path, listing: Listing, shard_size: int, ident: ModelId, sets: dict[str, Any],
         force: bool = False) -> Plan:
    """What to keep, make and remove in ``folder``; refuses (one line, nothing touched) a folder holding shards of
    another checkpoint unless ``force``."""
    parts = partitions(len(listing), shard_size)
    found = existing_shards(folder)
    metas = {i: read_meta(p) for i, p in found.items()}
    foreign = {i: m for i, m in metas.items() if m is not None and m.get("model", {}).get("checkpoint") != ident.checkpoint}
    notes: list[str] = []
    if foreign and not force:
        m = next(iter(foreign.values()))["model"]
        raise UsageError(f"{folder} holds {len(foreign)} shard(s) of another model ({m.get('artifact')}, checkpoint "
                         f"{str(m.get('checkpoint'))[:12]}; this one's is {ident.checkpoint[:12]}): write to another "
                         "folder, or pass --force to replace them")
    kept: dict[int, dict[str, Any]] = {}
    remove: list[Path] = []
    unreadable = 0
    for i, path in sorted(found.items()):
        meta = metas[i]
        if i >= len(parts):
            remove.append(path)
            continue
        if meta is None:
            unreadable += 1
            continue
        part = parts[i]
        pm = meta.get("partition", {})
        if (meta.get("model", {}).get("sha256") == ident.sha256 and meta.get("settings") == sets
                and pm.get("start") == part.start and pm.get("stop") == part.stop
                and pm.get("source_hash") == source_hash(listing, part)):
            kept[i] = meta
    if unreadable:
        notes.append(f"{unreadable} shard(s) in {folder} were not whole (a crash while writing?): made again")
    if remove:
        notes.append(f"removed {len(remove)} shard(s) that match no partition of this source any more "
                     f"({', '.join(p.name for p in remove[:3])}{' …' if len(remove) > 3 else ''})")
    remade = sum(1 for i in found if i < len(parts) and i not in kept) - unreadable
    if remade:
        notes.append(f"{remade} shard(s) made again: their images, the model or --top-k changed since")
    todo = [p for p in parts if p.index not in kept]
    return Plan(parts, todo, kept, remove, notes)


def _manifest_of(model: Path, backend: str, threads: int | None) -> Any:
    """The model's manifest without running it where possible (an engine's sidecar, an ONNX's metadata)."""
    from vitdeploy.core.artifact import read_manifest
    from vitdeploy.runners import artifact_kind

    if artifact_kind(model) in ("onnx", "engine"):
        return read_manifest(model)
    from vitdeploy.tools.infer import open_model

    runner, _ = open_model(model, backend, threads)
    try:
        return runner.manifest
    finally:
        runner.close()


def infer_corpus(
    inputs: Sequence[str | Path],
    out: str | Path,
    model: str | Path | None = None,
    backend: str = "auto",
    batch_size: int = 8,
    top_k: int = 5,
    threads: int | None = None,
    workers: int | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    ray: bool = False,
    ray_address: str | None = None,
    actors: int | None = None,
    force: bool = False,
    progress: Progress | None = None,
    notes_out: Callable[[str], None] | None = None,
) -> CorpusResult:
    """Run ``model`` over the corpus ``inputs`` into the shard folder ``out`` (see the module's docstring).

    ``ray``: on a local Ray, or the cluster RAY_ADDRESS names; ``ray_address``: on that cluster (implies ``ray``).
    ``progress(done, skipped, total)`` after each batch; ``notes_out`` gets the plan's notes before work starts.
    Raises VitdeployError when no image at all could be read; errors.parquet lists the unreadable files."""
    if shard_size < 1:
        raise UsageError(f"--shard-size {shard_size}: must be at least 1")
    if batch_size < 1:
        raise UsageError(f"--batch-size {batch_size}: must be at least 1")
    if actors is not None and actors < 1:
        raise UsageError(f"--actors {actors}: must be at least 1")
    if actors is not None and not (ray or ray_address):
        raise UsageError("--actors sets how many Ray actors run the model: add --ray (or --ray-address ADDR)")
    need("pyarrow")
    folder = Path(out)
    check_output(folder, [model, *inputs], kind="dir")
    use_ray = bool(ray or ray_address)
    address = None
    if use_ray:
        from vitdeploy.tools.corpus.ray_exec import resolve_address

        need("ray")
        address = resolve_address(ray_address)  # an unreachable cluster is refused here, before anything is written
    listing = read_source(inputs)
    from vitdeploy.tools.infer import open_model

    runner = None
    if use_ray:
        if model is None:
            runner, _ = open_model(None, backend, threads)  # the pick from this folder, as infer picks it
            model = runner.artifact
            runner.close()
            runner = None
        manifest = _manifest_of(Path(model), backend, threads)
    else:
        runner, picked = open_model(model, backend, threads)
        model, manifest = runner.artifact, runner.manifest
        for n in picked:
            if notes_out:
                notes_out(n)
    try:
        return _run(listing, folder, Path(model), manifest, runner, backend, batch_size, top_k, threads, workers,
                    shard_size, use_ray, address, actors, force, progress, notes_out)
    finally:
        if runner is not None:
            runner.close()


def _run(listing: Listing, folder: Path, model: Path, manifest: Any, runner: Any, backend: str, batch_size: int,
         top_k: int, threads: int | None, workers: int | None, shard_size: int, use_ray: bool, address: str | None,
         actors: int | None, force: bool, progress: Progress | None,
         notes_out: Callable[[str], None] | None) -> CorpusResult:
    from vitdeploy.core.task import task_of
    from vitdeploy.tools.infer import check_batch_fits

    check_batch_fits(manifest, batch_size)
    ident = model_id(model, manifest)
    sets = settings(manifest, top_k)
    pl = plan(folder, listing, shard_size, ident, sets, force)
    for n in pl.notes:
        if notes_out:
            notes_out(n)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    for p in pl.remove:
        p.unlink(missing_ok=True)
    res = CorpusResult(folder, model, runner.backend if runner is not None else backend,
                       runner.precision if runner is not None else str(manifest.precision),
                       "ray" if use_ray else "in-process", shards=len(pl.parts), kept=len(pl.kept),
                       removed=[p.name for p in pl.remove], notes=list(pl.notes))
    names = output_names(manifest, top_k)
    dim = task_of(manifest).dim if task_of(manifest).is_embedding else None
    host = socket.gethostname()
    total = len(listing)
    state = {"done": sum(pl.parts[i].size for i in pl.kept), "skipped": 0}

    def on_batch(n: int, skipped: int) -> None:
        state["done"] += n + skipped
        state["skipped"] += skipped
        res.images_run += n + skipped
        if progress:
            progress(state["done"] - state["skipped"], state["skipped"], total)

    def on_shard(part: Partition, b: ShardBuilder, seconds: float, node: str | None, made_on: str) -> None:
        rows = b.rows(names, dim)
        meta = {"model": {**ident.to_dict(), "precision": res.precision, "backend": res.backend},
                "partition": {"index": part.index, "start": part.start, "stop": part.stop, "shard_size": shard_size,
                              "source_hash": source_hash(listing, part)},
                "settings": sets, "rows": len(rows.ids), "skipped": len(rows.skipped),
                "errors": [list(e) for e in rows.skipped], "node": node, "host": made_on,
                "seconds": round(seconds, 3), "nodes": sorted(b.nodes) if b.nodes else None}
        write_shard(folder, part.index, table_of(rows, dim), meta)
        res.made += 1
        if node:
            res.nodes.add(node)

    if progress:
        progress(state["done"], 0, total)
    t0 = time.perf_counter()
    if pl.todo:
        if use_ray:
            from vitdeploy.tools.corpus.ray_exec import run_on_ray

            try:
                run_on_ray(listing, pl.todo, model, manifest, backend, batch_size, top_k, threads, address, actors,
                           on_batch, on_shard)
            except BaseException:
                if created and not any(folder.iterdir()):  # a Ray that could not start or join: DIR not left behind
                    folder.rmdir()
                raise
        else:
            run_in_process(listing, pl.todo, runner, batch_size, top_k, workers, host, on_batch, on_shard)
    res.seconds = time.perf_counter() - t0
    _finish(res, folder, len(pl.parts))
    return res


def _finish(res: CorpusResult, folder: Path, n_parts: int) -> None:
    """errors.parquet and the totals, from every shard's footer (kept and made alike)."""
    errors: list[tuple[int, str, str]] = []
    rows = 0
    for i, path in sorted(existing_shards(folder).items()):
        if i >= n_parts:
            continue
        meta = read_meta(path)
        if meta is None:  # cannot happen for a shard just renamed into place; said rather than hidden
            raise VitdeployError(f"{path}: not readable after it was written; run the command again")
        rows += int(meta["rows"])
        errors += [(i, p, r) for p, r in meta.get("errors", [])]
    res.rows = rows
    res.errors = [(p, r) for _, p, r in errors]
    write_errors(folder, res.errors)
    if rows == 0:
        first = f" (e.g. {res.errors[0][0]}: {res.errors[0][1]})" if res.errors else ""
        raise VitdeployError(f"none of the images could be read{first}; {folder / ERRORS_NAME} lists them")


# --- the in-process executor -----------------------------------------------------------------------------------------


def _load(item: Any, pp: Any) -> Any:
    from vitdeploy.core.preprocess import preprocess_file

    return preprocess_file(item[1], pp)


def run_in_process(listing: Listing, todo: list[Partition], runner: Any, batch_size: int, top_k: int,
                   workers: int | None, host: str, on_batch: Callable[[int, int], None],
                   on_shard: Callable[[Partition, ShardBuilder, float, str | None, str], None]) -> None:
    """Partition after partition in this process: the reader threads decode ahead (``iter_batches``), the runner
    runs, the shard is written when its partition is done. One partition's rows are held at a time."""
    from vitdeploy.core.images import iter_batches
    from vitdeploy.tools.corpus.batch import output_columns

    pp = runner.manifest.pp()
    for part in todo:
        t0 = time.perf_counter()
        b = ShardBuilder(part.size, listing.has_classes)
        items = [(i, listing.path(i)) for i in range(part.start, part.stop)]
        for batch in iter_batches(items, pp, batch_size, workers=workers, loader=_load):
            for item, why in batch.skipped:  # the items are (id, path): iter_batches hands them back as given
                b.skip(item[0], item[1], why)  # type: ignore[index]
            if batch.paths:
                cols, ok = output_columns(runner, batch.array, top_k)
                got: list[Any] = list(batch.paths)
                ids = [int(it[0]) for it in got]
                b.add(ids, [str(it[1]) for it in got], [listing.class_of(i) for i in ids], cols, ok)
            on_batch(len(batch.paths), len(batch.skipped))
        on_shard(part, b, time.perf_counter() - t0, None, host)
