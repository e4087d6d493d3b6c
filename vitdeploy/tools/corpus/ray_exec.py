"""The Ray Data executor: Ray Data's batch-inference pattern, with the sink kept in the driver.

- A dataset of the partitions to do (``ray.data.range``), one block each, so the driver holds no row of the corpus;
  the listing travels once through the object store (a few bytes a path).
- Decode stage: Ray tasks (``map_batches`` with a generator) turn a partition into decoded chunks of at most ~16 MB
  with ``preprocess_file``, the code infer runs; an unreadable file becomes a row with its reason.
- Model stage: ``map_batches(ModelActor, compute=ActorPoolStrategy(size=N))``, the model loaded once per actor from
  bytes shipped through the object store (a file of at most 256 MB) or from its path (every node must read it).
- The driver gathers each partition's rows as they stream out and hands a finished partition to the sink, which
  writes it by name: a retried task cannot duplicate a row, and DIR need only be writable on the driver.

Resources fit the cluster: a share of its CPUs (at least one, at most half) is left to the decode tasks, the rest is
split between the actors in fractional CPUs (two 1-CPU actors on 2 cores starve the read task for ever; 0.5 works),
and ONNX Runtime / OpenVINO get as many threads as the actor has CPUs (they otherwise size their pool to the host:
onnxruntime#3099, ray#28044). An engine or ONNX Runtime's CUDA provider asks for ``num_gpus``. Ray's own logs stay
in its session folder; its errors reach the driver as exceptions, said in one line.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.core.errors import UsageError, VitdeployError

SHIP_LIMIT = 256 << 20  # a model file up to this size goes through the object store
CHUNK_BYTES = 16 << 20  # decoded images per block out of the decode stage
CONNECT_TIMEOUT_S = 15.0


# --- where -----------------------------------------------------------------------------------------------------------


def resolve_address(ray_address: str | None) -> str:
    """The address ``ray.init`` gets: ``--ray-address ADDR``; else RAY_ADDRESS when set (``--ray`` joins it); else
    "local", a new Ray on this machine (``ray.init()`` alone would honour a stale RAY_ADDRESS). A host:port that
    does not answer is refused in one line, before anything is written (exit 1)."""
    addr = ray_address or os.environ.get("RAY_ADDRESS") or "local"
    if addr in ("local", "auto"):
        return addr
    target = addr.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray-address {addr}: give HOST:PORT, the address `ray start --head` prints (e.g. "
                         "10.0.0.5:6379)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        where = "--ray-address" if ray_address else "RAY_ADDRESS"
        raise VitdeployError(f"{where} {addr}: no Ray cluster answers there ({e.strerror or e}); start one with "
                             "`ray start --head` and pass the address it prints, or drop it to run on a local Ray") from None
    return addr


# --- how much ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    actors: int
    num_cpus: float  # per actor
    num_gpus: float  # per actor
    threads: int  # the runtime's threads per actor
    read_cpus: float  # per decode task

    def to_dict(self) -> dict[str, Any]:
        return {"actors": self.actors, "num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "threads": self.threads,
                "read_cpus": self.read_cpus}


def uses_gpu(model: str | Path, backend: str, providers: list[str] | None = None) -> bool:
    """Whether the model stage needs a GPU: an engine, or ONNX Runtime asked for its CUDA provider."""
    from vitdeploy.runners import artifact_kind

    return artifact_kind(model) == "engine" or backend == "tensorrt" or "CUDAExecutionProvider" in (providers or [])


def actor_resources(cpus: float, gpus: float, gpu: bool, actors: int | None = None,
                    threads: int | None = None) -> Resources:
    """Ray resources per actor on a cluster of ``cpus`` and ``gpus``: up to a quarter of the CPUs (at least one, at most
    half) left to the decode tasks, the rest split between the actors; a GPU model gets one actor per GPU by default
    (a fraction of one each when ``actors`` is more)."""
    if cpus <= 0:
        raise VitdeployError("the Ray cluster has no CPU: start its nodes with `ray start --num-cpus N`")
    read = min(max(1.0, cpus / 4), cpus / 2)
    rest = cpus - read
    if gpu:
        if gpus <= 0:
            raise VitdeployError("this model runs on a GPU (an engine or the CUDA provider) and the Ray cluster has "
                                 "none: start a node with a GPU, or run an ONNX model on the CPU")
        n = actors or max(1, int(gpus))
        per_gpu = min(1.0, gpus / n)
        per_cpu = min(1.0, rest / n)
    else:
        n = actors or (max(2, round(rest)) if cpus >= 2 else 1)
        per_gpu = 0.0
        per_cpu = rest / n
    per_cpu = max(0.01, round(per_cpu, 3))
    return Resources(n, per_cpu, round(per_gpu, 3), threads or max(1, round(per_cpu)), round(read / 2, 3))


# --- the stages ------------------------------------------------------------------------------------------------------

_listing_cache: dict[str, Any] = {}


def _listing(ref: Any) -> Any:
    import ray

    key = ref.hex()
    if key not in _listing_cache:
        _listing_cache.clear()
        _listing_cache[key] = ray.get(ref)
    return _listing_cache[key]


def decode_partitions(batch: dict[str, np.ndarray], listing: list[Any], todo: np.ndarray, preprocess: dict[str, Any],
                      chunk: int) -> Iterator[dict[str, np.ndarray]]:
    """The decode stage: for each partition named in ``batch``, its images decoded in chunks of ``chunk``, each row
    with its id, partition, path, class and the reason it could not be read (empty when it could)."""
    from vitdeploy.core.preprocess import Preprocess
    from vitdeploy.tools.corpus.batch import decode

    lst = _listing(listing[0])
    pp = Preprocess.from_dict(preprocess)
    h, w = pp.input_size
    for k in batch["id"]:
        index, start, stop = (int(v) for v in todo[int(k)])
        for s in range(start, stop, chunk):
            e = min(s + chunk, stop)
            n = e - s
            pixels = np.zeros((n, 3, h, w), np.float32)
            errors = np.empty(n, object)
            paths = np.empty(n, object)
            classes = np.empty(n, object)
            for j, i in enumerate(range(s, e)):
                p = lst.path(i)
                paths[j] = p
                classes[j] = lst.class_of(i) or ""
                arr, why = decode(p, pp)
                if arr is None:
                    errors[j] = why or "unreadable"
                else:
                    pixels[j] = arr
                    errors[j] = ""
            yield {"id": np.arange(s, e, dtype=np.int64), "part": np.full(n, index, np.int64), "path": paths,
                   "cls": classes, "pixels": pixels, "error": errors}


class ModelActor:
    """The model stage: one runner per actor, loaded once, with the threads its CPUs allow."""

    def __init__(self, model: list[Any], name: str, backend: str, threads: int, top_k: int, batch_size: int) -> None:
        import ray

        from vitdeploy.core.task import task_of
        from vitdeploy.tools.corpus.batch import output_names
        from vitdeploy.tools.infer import open_model

        path = model[0]
        if not isinstance(path, str):  # the file's bytes, shipped through the object store
            self._tmp = tempfile.mkdtemp(prefix="vitdeploy-model-")
            path = os.path.join(self._tmp, name)
            with open(path, "wb") as f:
                f.write(ray.get(model[0]))
        self.runner, _ = open_model(path, backend, threads)
        self.top_k, self.batch_size = top_k, batch_size
        task = task_of(self.runner.manifest)
        self.columns = output_names(self.runner.manifest, top_k)
        self.dim = int(task.dim or 0) if task.is_embedding else 0
        self.node = ray.get_runtime_context().get_node_id()
        self.host = socket.gethostname()

    def __call__(self, block: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One decoded chunk (a whole partition where it fits in one), run in batches of ``batch_size``."""
        n = len(block["id"])
        parts = [self._run({k: v[s:s + self.batch_size] for k, v in block.items()})
                 for s in range(0, n, self.batch_size)]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else self._run(block)

    def _run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from vitdeploy.tools.corpus.batch import NAN_REASON, output_columns

        t0 = time.perf_counter()
        errors = np.asarray(batch["error"], object).copy()
        good = np.asarray([not e for e in errors], bool)
        n = len(errors)
        out: dict[str, np.ndarray] = {k: batch[k] for k in ("id", "part", "path", "cls")}
        cols: dict[str, Any] = {}
        if good.any():
            cols, ok = output_columns(self.runner, np.ascontiguousarray(batch["pixels"][good]), self.top_k)
            where = np.flatnonzero(good)
            errors[where[~ok]] = NAN_REASON
        for name in self.columns:
            value = cols.get(name)
            full: np.ndarray
            if name == "embedding":
                full = np.zeros((n, self.dim), np.float32)
            elif name.startswith("score"):
                full = np.zeros(n, np.float32)
            else:
                full = np.full(n, "", object)
            if value is not None:
                full[good] = np.asarray(value, full.dtype)
            out[name] = full
        out["error"] = errors
        out["node"] = np.full(n, self.node, object)
        out["host"] = np.full(n, self.host, object)
        out["seconds"] = np.full(n, (time.perf_counter() - t0) / max(1, n), np.float64)
        return out


def model_stage_request(plan: Resources) -> dict[str, Any]:
    """The resources ``map_batches`` asks for per model actor: its CPUs, and a GPU (or a share) for a GPU model."""
    # max_restarts=0: the model's bytes reach the actor through the object store, which a restarted actor cannot count
    # on (ray#53727, said as an error line on the terminal otherwise); a failed actor fails the run, and the same
    # command resumes it
    req: dict[str, Any] = {"num_cpus": plan.num_cpus, "max_restarts": 0}
    if plan.num_gpus:
        req["num_gpus"] = plan.num_gpus
    return req


def _ship(model: Path) -> list[Any]:
    """The model for the actors: its bytes in the object store when it is one small self-contained file, else its
    path (which every node must then read)."""
    import ray

    if model.is_file() and model.stat().st_size <= SHIP_LIMIT and model.suffix in (".onnx", ".pth", ".pt"):
        if model.suffix == ".onnx":
            import onnx
            from onnx.external_data_helper import uses_external_data

            proto = onnx.load(str(model), load_external_data=False)
            if any(uses_external_data(t) for t in proto.graph.initializer):
                return [str(model.resolve())]
        return [ray.put(model.read_bytes())]
    return [str(model.resolve())]


def quiet_ray() -> None:
    """Ray's and Ray Data's own logs and bars out of the user's terminal (they stay in Ray's session folder)."""
    for name in ("ray", "ray.data", "ray._private", "ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")


def start_ray(address: str) -> bool:
    """``ray.init`` at ``address`` (a new local Ray sized to this process's cores); False when Ray was already
    initialised by the caller (then it is left running)."""
    import ray

    from vitdeploy.core.host import available_cores

    if ray.is_initialized():
        return False
    quiet_ray()
    kwargs: dict[str, Any] = {"address": address, "include_dashboard": False, "log_to_driver": False,
                              "logging_level": logging.ERROR, "configure_logging": True}
    if address == "local":
        from vitdeploy.tools.bench import available_memory

        free = available_memory() or (4 << 30)
        # at least 2 logical CPUs: on 1 (a process pinned to one core, as pytest-xdist pins its workers) Ray Data
        # never started a decode task beside the 0.5-CPU actor, and the run waited for ever (measured with Ray 2.60;
        # a cluster of 1-CPU nodes waits the same way). Ray's CPUs are scheduling slots: the threads stay 1 per actor
        kwargs.update(num_cpus=max(2, available_cores()), object_store_memory=int(max(128 << 20, min(2 << 30, free // 5))))
    try:
        ray.init(**kwargs)
    except (ConnectionError, TimeoutError, RuntimeError) as e:
        if asks_for_token(e):
            raise VitdeployError(f"the Ray cluster at {address} asks for a token (Ray's token authentication): set "
                                 "RAY_AUTH_MODE=token, with the cluster's token in ~/.ray/auth_token or "
                                 "RAY_AUTH_TOKEN") from None
        raise VitdeployError(f"Ray could not start or join {address}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return True


def asks_for_token(error: BaseException) -> bool:
    """Whether ``ray.init`` failed because the cluster wants a token: Ray 2.60's ``ray start --head`` turns token
    authentication on where ~/.ray/auth_token exists (any local ``ray.init()`` writes it), while a driver joining by
    an explicit address never does, and says only "Failed to connect to Ray cluster" (the cause, deeper in the chain,
    names InvalidAuthToken)."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def run_on_ray(listing: Any, todo: list[Any], model: Path, manifest: Any, backend: str, batch_size: int, top_k: int,
               threads: int | None, address: str | None, actors: int | None,
               on_batch: Callable[[int, int], None], on_shard: Callable[..., None]) -> Resources:
    """Run the partitions ``todo`` on Ray (see the module's docstring); the sink gets each as it completes."""
    import ray

    from vitdeploy.tools.corpus.batch import ShardBuilder

    started = start_ray(address or "local")
    try:
        import ray.data

        quiet_ray()  # again: importing ray.data configures its own loggers
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.enable_operator_progress_bars = False
        ctx.print_on_execution_start = False
        ctx.execution_options.verbose_progress = False
        res = ray.cluster_resources()
        plan = actor_resources(float(res.get("CPU", 0)), float(res.get("GPU", 0)), uses_gpu(model, backend),
                               actors, threads)
        pp = manifest.pp()
        h, w = pp.input_size
        chunk = max(batch_size, min(max(p.size for p in todo), CHUNK_BYTES // (3 * h * w * 4)))
        table = np.asarray([(p.index, p.start, p.stop) for p in todo], np.int64)
        listing_ref = [ray.put(listing.frozen())]
        ds = ray.data.range(len(todo), override_num_blocks=len(todo))
        # the decode tasks ask for the memory of the chunks they hold, which also keeps them a stage of their own:
        # Ray Data fuses a task stage into the actors that follow when their resource requests are equal (0.5 and
        # 0.5 CPU on 2 cores), and decoding would then run inside the model's actors
        ds = ds.map_batches(decode_partitions, batch_size=1, batch_format="numpy",  # type: ignore[arg-type]
                            num_cpus=plan.read_cpus, memory=2 * chunk * 3 * h * w * 4 + (64 << 20),
                            fn_kwargs={"listing": listing_ref, "todo": table, "preprocess": pp.to_dict(),
                                       "chunk": chunk})
        with warnings.catch_warnings():  # max_restarts is passed as a remote arg, which Ray 2.60 calls deprecated
            warnings.simplefilter("ignore")
            # batch_size=None: an actor takes a decoded chunk whole (a whole partition where it fits in 16 MB), so a
            # shard is made on one node, and runs it in batches of --batch-size
            ds = ds.map_batches(ModelActor, batch_size=None, batch_format="numpy",
                                compute=ray.data.ActorPoolStrategy(size=plan.actors), **model_stage_request(plan),
                                fn_constructor_kwargs={"model": _ship(model), "name": model.name, "backend": backend,
                                                       "threads": plan.threads, "top_k": top_k,
                                                       "batch_size": batch_size})
        parts = {p.index: p for p in todo}
        building: dict[int, ShardBuilder] = {}
        seconds: dict[int, float] = {}
        hosts: dict[str, str] = {}
        has_classes = listing.has_classes
        output = None
        try:
            for batch in ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=1):
                if output is None:
                    output = [k for k in batch if k not in ("id", "part", "path", "cls", "error", "node", "host",
                                                            "seconds")]
                ids, part_of = batch["id"], batch["part"]
                errs = batch["error"]
                for pi in np.unique(part_of):
                    sel = np.flatnonzero(part_of == pi)
                    b = building.setdefault(int(pi), ShardBuilder(parts[int(pi)].size, has_classes))
                    good = [j for j in sel if not errs[j]]
                    for j in sel:
                        hosts[str(batch["node"][j])] = str(batch["host"][j])
                        if errs[j]:
                            b.skip(int(ids[j]), str(batch["path"][j]), str(errs[j]), str(batch["node"][j]))
                    if good:
                        g = np.asarray(good, np.int64)
                        cols = {k: (batch[k][g] if k == "embedding" or k.startswith("score") else list(batch[k][g]))
                                for k in output}
                        b.add([int(v) for v in ids[g]], [str(v) for v in batch["path"][g]],
                              [(str(v) or None) for v in batch["cls"][g]], cols, np.ones(len(g), bool))
                        for j in g:
                            b.nodes[str(batch["node"][j])] = b.nodes.get(str(batch["node"][j]), 0) + 1
                    seconds[int(pi)] = seconds.get(int(pi), 0.0) + float(batch["seconds"][sel].sum())
                    on_batch(len(good), len(sel) - len(good))
                    if b.complete:
                        node = max(b.nodes, key=lambda k: b.nodes[k]) if b.nodes else None
                        on_shard(parts[int(pi)], building.pop(int(pi)), seconds.pop(int(pi), 0.0), node,
                                 hosts.get(node or "", socket.gethostname()))
        except Exception as e:  # Ray wraps an actor's or a task's error: said in one line, the traceback in --debug
            from vitdeploy.core.errors import VitdeployError as VE

            cause: BaseException = e
            while getattr(cause, "cause", None) is not None and cause is not getattr(cause, "cause", None):
                cause = cause.cause  # type: ignore[attr-defined]  # a RayTaskError's chain
            if isinstance(cause, VE):
                raise VE(str(cause), cause.exit_code) from e
            first = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
            raise VitdeployError(f"the Ray run failed: {first}") from e
        if building:
            left = ", ".join(str(i) for i in sorted(building)[:5])
            raise VitdeployError(f"the Ray run ended with partition(s) {left} incomplete; run the command again")
        return plan
    finally:
        if started:
            ray.shutdown()


