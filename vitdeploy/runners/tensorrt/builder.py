"""The TensorRT builder: one decided ONNX graph → one serialized plan, its sidecar and the timing cache.

The loader half of the TensorRT backend (Polygraphy's shape), beside ``runner.py`` which loads and runs the plan.
It makes no numeric decision: the precision is in the graph, ``versions.network_plan`` says which network and
builder flags each TensorRT release needs for it, and ``BuildSpec`` carries everything else. The plan is written
as TensorRT serialized it — no header — so trtexec, Triton and DeepStream load it; ``<engine>.json`` beside it
holds the manifest and how it was built. ``import tensorrt`` happens only inside ``compile_engine``.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.fileio import atomic_path
from vitdeploy.core.loaded import SourceReads, read_hashed
from vitdeploy.core.manifest import Manifest, sidecar_path, tool_versions
from vitdeploy.runners.tensorrt.inspector import UNKNOWN, Receipt, engine_information, judge, receipt_from_json
from vitdeploy.runners.tensorrt.probe import TensorRTEnv
from vitdeploy.runners.tensorrt.versions import NetworkPlan, Profile, engine_record, network_plan

Event = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class BuildSpec:
    """Everything one engine build needs besides TensorRT itself; the printed vitdeploy and trtexec lines
    (``commands.py``) are made from the same spec, so they build what ``compile_engine`` would."""

    artifact: Path  # the ONNX TensorRT parses (its precision is in the graph)
    engine: Path
    input_name: str
    dims: tuple[int, ...] | list[int]  # the image input; -1 for the batch
    profile: Profile
    precision: str  # fp32, fp16 or int8: what the graph carries
    workspace: float | None = None  # GiB; None: TensorRT's default
    timing_cache: Path | None = None
    dla_core: int | None = None
    version_compatible: bool = False

    def network_plan(self, trt_version: str) -> NetworkPlan:
        """The network and builder flags this spec needs on ``trt_version`` (refused where it cannot be built)."""
        return network_plan(trt_version, self.precision, self.dla_core is not None, self.version_compatible)

    def options(self) -> dict[str, Any]:
        """The build options as the sidecar records them."""
        return {
            "min_batch": self.profile.min, "opt_batch": self.profile.opt, "max_batch": self.profile.max,
            "workspace_gib": self.workspace, "timing_cache": str(self.timing_cache) if self.timing_cache else None,
            "dla_core": self.dla_core, "version_compatible": self.version_compatible,
        }


@dataclass
class BuiltEngine:
    """What ``compile_engine`` wrote: the plan, its sidecar, and the build record inside the sidecar."""

    engine: Path
    sidecar: Path
    record: dict[str, Any]


def logger(trt: Any) -> Any:
    return trt.Logger(trt.Logger.WARNING)


def dla_cores(env: TensorRTEnv) -> int:
    """How many DLA cores TensorRT's builder sees on this device (0 on Thor, Nano and desktop GPUs)."""
    from vitdeploy.runners.tensorrt.errors import trt_call

    return int(trt_call(env.trt.Builder, logger(env.trt), what="trt.Builder").num_DLA_cores)


def compile_engine(spec: BuildSpec, env: TensorRTEnv, manifest: Manifest, graph: Any = None,
                   emit: Event | None = None, notes: dict[str, Any] | None = None) -> BuiltEngine:
    """Parse ``spec.artifact``, build one plan, write it and its sidecar atomically (and the timing cache).

    ``manifest`` is the artifact's (the sidecar derives from it); ``graph`` its onnx.ModelProto, needed only
    where a weakly typed (8.x) build pins the float32 islands (read from ``spec.artifact`` when None);
    ``notes`` are added to the build record (e.g. the artifact's check against FP32).
    """
    import tensorrt as trt

    say = emit or (lambda kind, d: None)
    version = str(trt.__version__)
    nplan = spec.network_plan(version)
    log = logger(trt)
    from vitdeploy.runners.tensorrt.errors import trt_call

    builder = trt_call(trt.Builder, log, what="trt.Builder")  # CUDA that cannot start: CudaUnavailable, one line
    network = builder.create_network(network_flags(trt, nplan))
    parser = trt_call(trt.OnnxParser, network, log, what="trt.OnnxParser")
    # the source's SHA-256 from one read just before the parse; the file's identity then is checked again before the
    # engine is written, so the bytes hashed are the bytes TensorRT parsed (core/loaded.py), never a later file
    with SourceReads("build-engine") as reads:
        read_hashed(spec.artifact)
    if not parser.parse_from_file(str(spec.artifact)):
        errors = [str(parser.get_error(i).desc()) for i in range(parser.num_errors)]
        raise VitdeployError(
            f"{spec.artifact}: TensorRT {version} cannot parse it: {'; '.join(errors)[:300] or 'no reason given'}"
            " (TensorRT 8.5/8.6 read ONNX opsets up to 17: re-export with --opset 17)"
        )
    config = builder.create_builder_config()
    if spec.workspace is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(spec.workspace * (1 << 30)))
    for flag in nplan.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    # the layer information the precision receipt reads (IBuilderConfig.profiling_verbosity: every binding 8.6.1-11.4)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if "OBEY_PRECISION_CONSTRAINTS" in nplan.builder_flags:
        if graph is None:
            graph = OnnxArtifact.open(spec.artifact).model
        say("pinned", {"layers": pin_float32_layers(trt, network, graph)})
    if spec.dla_core is not None:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = int(spec.dla_core)
    mn, op, mx = spec.profile.shapes(spec.dims)
    prof = builder.create_optimization_profile()
    prof.set_shape(spec.input_name, trt.Dims(list(mn)), trt.Dims(list(op)), trt.Dims(list(mx)))
    if config.add_optimization_profile(prof) < 0:
        raise VitdeployError(f"TensorRT refused the batch profile {mn} / {op} / {mx} for input {spec.input_name!r}")
    cache = None
    if spec.timing_cache is not None:
        cache = use_timing_cache(config, Path(spec.timing_cache), say)

    say("build", {"engine": str(spec.engine), "tensorrt": version})
    t0 = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - t0
    if serialized is None:
        raise VitdeployError(f"TensorRT {version} could not build {spec.artifact}: see its messages above")

    record = engine_record(
        trt_version=version, gpu_name=env.gpu or "?", compute_capability=env.compute_capability or (0, 0),
        profile=spec.profile, input_name=spec.input_name, input_dims=spec.dims, plan=nplan, options=spec.options(),
        build_seconds=seconds, source=spec.artifact, source_sha256=reads.sha256(spec.artifact),
        cuda_runtime=env.cuda_runtime,
    )
    record["built_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    record.update(notes or {})
    receipt = engine_receipt(trt, serialized, log)
    record["receipt"] = receipt.to_dict()
    say("receipt", record["receipt"])
    missed = judge(receipt, spec.precision)
    reads.require_unchanged()  # re-written while it was built: one line, no engine that names other bytes
    side = sidecar_manifest(manifest, record, spec.artifact)
    sidecar = sidecar_path(spec.engine)
    if missed is not None:  # the precision asked for did not happen: keep the plan for a look, never as the engine
        from vitdeploy.core.outputs import side_output_path

        rejected = side_output_path("rejected engine", spec.engine)
        with atomic_path(rejected) as tmp_engine, atomic_path(sidecar_path(rejected)) as tmp_side:
            with open(tmp_engine, "wb") as f:
                f.write(memoryview(serialized))
            tmp_side.write_text(side.to_json(indent=2) + "\n")
        raise VitdeployError(f"{spec.engine} not written: {missed}; the plan is kept as {rejected.name} "
                             f"(its sidecar has the receipt)")
    with atomic_path(spec.engine) as tmp_engine, atomic_path(sidecar) as tmp_side:
        with open(tmp_engine, "wb") as f:
            f.write(memoryview(serialized))
        tmp_side.write_text(side.to_json(indent=2) + "\n")
    if cache is not None and spec.timing_cache is not None:
        timing = config.get_timing_cache()
        with atomic_path(spec.timing_cache) as tmp_cache, open(tmp_cache, "wb") as f:
            f.write(memoryview(timing.serialize()))
    say("built", {"engine": str(spec.engine), "seconds": seconds})
    return BuiltEngine(spec.engine, sidecar, record)


def engine_receipt(trt: Any, serialized: Any, log: Any) -> Receipt:
    """The precision receipt of a plan just built: read back and asked through TensorRT's engine inspector
    (runners/tensorrt/inspector.py parses it). Anything that cannot be read is an "unknown" receipt, never a guess."""
    from vitdeploy.runners.tensorrt.errors import trt_call

    try:
        engine = trt_call(trt.Runtime, log, what="trt.Runtime").deserialize_cuda_engine(serialized)
        if engine is None:
            return Receipt(UNKNOWN, reason="the plan could not be read back for its layer information")
        return receipt_from_json(engine_information(engine))
    except VitdeployError:
        raise
    except Exception as e:  # noqa: BLE001 - an inspector this TensorRT lacks or that fails: unknown, said why
        return Receipt(UNKNOWN, reason=f"the engine inspector failed ({type(e).__name__}: {str(e)[:120]})")


def pin_float32_layers(trt: Any, network: Any, model: Any) -> int:
    """On a weakly typed (8.x) FP16/INT8 build, make the graph's float32 islands binding: every Softmax and reduction
    layer, every layer of a LayerNorm (one op, or spelled out for 8.5) and every node numerics kept float32 (the
    manifest's kept_fp32_nodes: graph/fp16.py pinned_fp32_nodes) computes and outputs FP32 (with
    OBEY_PRECISION_CONSTRAINTS set). Layers are matched to ONNX nodes by name, as onnx-tensorrt names them.
    ``model`` is the artifact's graph (onnx.ModelProto). Returns how many layers were pinned."""
    from vitdeploy.graph.fp16 import pinned_fp32_nodes

    names = pinned_fp32_nodes(model)
    kinds = (trt.LayerType.SOFTMAX, trt.LayerType.REDUCE)
    pinned = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type in kinds or layer.name in names:  # not the Casts named after them (they change the type)
            layer.precision = trt.float32
            for k in range(layer.num_outputs):
                layer.set_output_type(k, trt.float32)
            pinned += 1
    return pinned


def use_timing_cache(config: Any, path: Path, emit: Event) -> Any:
    """Read the timing cache into the builder; one from another device or TensorRT (None, or refused) is
    replaced by an empty one, and the build says so. Returns the cache in use (None: building without one)."""
    data = path.read_bytes() if path.exists() else b""
    cache = config.create_timing_cache(data)
    if cache is not None and config.set_timing_cache(cache, False):
        return cache
    if data:
        emit("warning", {"message": f"{path}: timing cache from another device or TensorRT version; building without "
                                    "it and writing a fresh one"})
    cache = config.create_timing_cache(b"")
    if cache is None or not config.set_timing_cache(cache, False):
        emit("warning", {"message": f"{path}: TensorRT could not make a timing cache; building without one"})
        return None
    return cache


def network_flags(trt: Any, nplan: NetworkPlan) -> int:
    """create_network's flag bits; EXPLICIT_BATCH only where it exists and is needed (8.x, 9.x)."""
    flags = 0
    if nplan.explicit_batch:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    if nplan.strongly_typed:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return flags


def sidecar_manifest(manifest: Manifest, record: dict[str, Any], artifact: Path) -> Manifest:
    """The artifact's manifest for the engine: same model, labels, preprocessing and precision, plus the build."""
    source = {"artifact": artifact.name, "sha256": record["source_sha256"], "kind": "onnx", "parent": manifest.source}
    versions = dict(manifest.versions)
    versions.update(tool_versions("onnx"))
    versions["tensorrt"] = record["tensorrt"]
    return manifest.derive(source=source, versions=versions, engine=record)
