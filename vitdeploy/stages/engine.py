"""ONNX → TensorRT plan, from the precision artifacts; imports tensorrt lazily.

The engine step compiles a decided graph and makes no numeric decisions of its own: ``--int8`` and
``--fp16`` only choose (or first make, through ``vitdeploy.stages.precision``) the ONNX whose graph carries
the precision. The plan is written as TensorRT serialized it — no header — so trtexec, Triton and
DeepStream load it; ``<engine>.json`` beside it holds the manifest and how it was built. Where
TensorRT or a GPU is missing, the precision artifact is still written and ``EngineNotBuilt``
(exit 3) carries the commands that finish the job on the target.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy.core.artifact import manifest_from_onnx
from vitdeploy.core.errors import PartlyDone, UsageError, VitdeployError
from vitdeploy.core.fileio import atomic_path, sha256_file
from vitdeploy.core.manifest import Manifest, sidecar_path, tool_versions
from vitdeploy.core.targets import CPU_TARGETS, target_facts, target_of_version
from vitdeploy.runners.tensorrt.versions import (
    ArtifactPlan,
    NetworkPlan,
    Profile,
    base_stem,
    engine_record,
    finish_commands,
    import_tensorrt,
    make_profile,
    network_plan,
    opset_problem,
    plan_artifact,
)

Event = Callable[[str, dict[str, Any]], None]


@dataclass
class BuildOptions:
    """``vitdeploy build-engine``'s options, with the same names and defaults."""

    fp16: bool = False
    int8: bool = False
    calib: Path = Path("calibration")
    min_batch: int = 1
    opt_batch: int = 8
    max_batch: int = 32
    workspace: float | None = None  # GiB
    timing_cache: Path | None = None
    dla_core: int | None = None
    version_compatible: bool = False
    out: Path | None = None
    # what a made artifact (--fp16/--int8) is made for; None: the TensorRT found here (else the model's target)
    target: str | None = None


@dataclass
class BuildResult:
    engine: Path
    sidecar: Path
    artifact: Path
    record: dict[str, Any]
    made: dict[str, Any] | None  # what make_artifact did (None: the model was built as it is)


class EngineNotBuilt(PartlyDone):
    """The precision artifact is written, the engine is not: ``missing`` says why, ``commands`` finish it."""

    def __init__(self, artifact: Path, made: dict[str, Any] | None, missing: str, commands: list[str]) -> None:
        self.artifact = artifact
        self.made = made  # what make_artifact did (None: the model was built as it is)
        self.made_artifact = made is not None
        self.missing = missing
        self.commands = commands
        super().__init__(f"{missing}: {artifact} is ready; build the engine on the target with: {commands[0]}")


# ---------------------------------------------------------------- what is here


@dataclass
class TensorRTEnv:
    """TensorRT and the GPU as found here; ``missing`` names what is not (None: everything is)."""

    trt: Any = None
    version: str | None = None
    gpu: str | None = None
    compute_capability: tuple[int, int] | None = None
    cuda_runtime: str | None = None
    missing: str | None = field(default=None)


def probe(device: int = 0) -> TensorRTEnv:
    from vitdeploy.runners.tensorrt.cuda import gpu_info

    trt = import_tensorrt()
    env = TensorRTEnv()
    if isinstance(trt, str):
        env.missing = trt
    else:
        env.trt, env.version = trt, str(trt.__version__)
    info = gpu_info(device)
    if isinstance(info, str):
        env.missing = f"{env.missing}, and {info}" if env.missing else info
    else:
        env.gpu, env.compute_capability, env.cuda_runtime = info
    return env


# ---------------------------------------------------------------- the ONNX input


@dataclass
class OnnxFacts:
    """What build-engine needs of an ONNX file, from one read: the graph (weights included unless stored as
    external data), its manifest, opset and image input."""

    path: Path
    model: Any
    manifest: Manifest
    opset: int
    input_name: str
    dims: list[int]  # -1 for the symbolic batch; a symbolic H, W is the manifest's size


def read_onnx_facts(path: Path) -> OnnxFacts:
    """Read ``path`` once (external data left on disk) and take everything build-engine asks of it."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise VitdeployError(f"{path}: not a readable ONNX model ({type(e).__name__}); re-export it") from None
    return onnx_facts(model, path)


def onnx_facts(model: Any, path: Path) -> OnnxFacts:
    """The facts of a graph already in memory (``path`` names it in errors)."""
    from vitdeploy.graph.edit import opset

    manifest = manifest_from_onnx(model, path)
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise VitdeployError(f"{path}: expected one image input, found {len(inputs)}; re-export it with `vitdeploy export`")
    inp = inputs[0]
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in inp.type.tensor_type.shape.dim]
    if len(dims) == 4 and dims[1] in (-1, 3) and -1 in dims[2:]:  # symbolic H, W: the manifest's size
        h, w = manifest.input_size
        dims = [dims[0], 3, h, w]
    return OnnxFacts(path, model, manifest, opset(model), inp.name, dims)


# ---------------------------------------------------------------- the command


def build_engine(model: str | Path = "model.onnx", options: BuildOptions | None = None,
                 on_event: Event | None = None) -> BuildResult:
    """Make the precision artifact where asked, then compile it into a plan with its sidecar.

    Raises UsageError for impossible options before any work starts, and EngineNotBuilt (exit 3)
    after writing the precision artifact where TensorRT or a CUDA GPU is missing.
    """
    o = options or BuildOptions()
    emit = on_event or (lambda kind, d: None)
    model = Path(model)
    profile = make_profile(o.min_batch, o.opt_batch, o.max_batch, o.dla_core)
    if o.workspace is not None and o.workspace <= 0:
        raise UsageError(f"--workspace {o.workspace}: give the builder's workspace limit in GiB, more than 0")
    if not model.exists():
        hint = " (run `vitdeploy export ckpt.pth` first)" if model.name == "model.onnx" else ""
        raise VitdeployError(f"{model}: no such file{hint}")
    if model.suffix != ".onnx":
        raise UsageError(f"{model}: build-engine takes an ONNX model; make one with `vitdeploy export {model}`")
    if o.target is not None:
        try:
            target_facts(o.target)
        except ValueError as e:
            raise UsageError(f"--target: {e}") from None
    source = read_onnx_facts(model)  # the one read of the source: manifest, opset and input come from it
    manifest = source.manifest
    plan = plan_artifact(model, manifest.precision, o.fp16, o.int8, o.out, o.dla_core)
    if plan.make is not None and plan.artifact.exists():
        kept_guard(plan.artifact)
    if plan.make == "int8" and not Path(o.calib).is_dir():
        raise VitdeployError(
            f"{o.calib}: no such folder of calibration images: put a few hundred images like the ones "
            "the model will see there, or pass --calib DIR"
        )

    env = probe()
    if env.missing is None:  # refuse what this device cannot do before any calibration or build starts
        network_plan(env.version or "0", plan.precision, o.dla_core is not None, o.version_compatible)
        if o.dla_core is not None:
            n = int(env.trt.Builder(_logger(env.trt)).num_DLA_cores)
            if o.dla_core >= n:
                raise UsageError(
                    f"--dla-core {o.dla_core}: this device has {n} DLA core{'s' if n != 1 else ''}"
                    + (" (Jetson Orin has them; Thor, Nano and desktop GPUs have none)" if n == 0 else "")
                )

    target = o.target
    if env.missing is None:  # an artifact made for another TensorRT: say so before calibrating or building
        target_mismatch(model, manifest, env.version or "0")
        here = target_of_version(env.version or "0")
        if target is not None and target != here:
            raise VitdeployError(f"--target {target}, but this is TensorRT {env.version} ({here}): build with "
                                 f"--target {here} here, or on a device with {target}")
        target = here
    elif target is None:
        target = manifest.target
    if env.missing is None:  # a parser that cannot read the opset: say so before calibrating or building
        problem = opset_problem(source.opset, env.version or "0")
        if problem:
            raise VitdeployError(f"{plan.artifact}: {problem}")
    made, art = make_artifact(plan, source, Path(o.calib), emit, target)
    if env.missing is not None:
        cmds = finish_commands(plan.artifact, plan.engine, art.input_name, art.dims, profile, plan.precision,
                               o.workspace, o.timing_cache, o.dla_core, o.version_compatible, art.opset)
        raise EngineNotBuilt(plan.artifact, made, env.missing, cmds)
    problem = opset_problem(art.opset, env.version or "0")
    if problem:
        raise VitdeployError(f"{plan.artifact} is written, but {problem}")
    return compile_engine(plan, art, env, profile, o, emit, made)


def kept_guard(artifact: Path) -> None:
    """Refuse to replace an INT8 artifact that `calibrate` checked with the accuracy guard by an unguarded one."""
    try:
        guard = read_onnx_facts(artifact).manifest.extra.get("guard")
    except VitdeployError:
        return  # not a vitdeploy model: replaced as any stale output
    if guard:
        raise UsageError(
            f"{artifact} exists and was calibrated with the accuracy guard: build it as it is "
            f"(`vitdeploy build-engine {artifact}`), or remove it to calibrate anew"
        )


def make_artifact(plan: ArtifactPlan, source: OnnxFacts, calib: Path, emit: Event,
                  target: str | None = None) -> tuple[dict[str, Any] | None, OnnxFacts]:
    """Write the FP16 or INT8 ONNX the engine is built from (vitdeploy.stages.precision), then check it against its source.

    ``source`` is the model as build-engine read it: the precision step works on that graph (the file is not
    read again) and may change it. Returns what was made (None when the artifact is built as it is: skipped
    calibration images, warnings, and the check: top-1 agreement and largest logit difference against the
    FP32 model on the calibration images, under ONNX Runtime) and the facts of the artifact to build.
    """
    if plan.make is None:
        return None, source
    try:
        precision = importlib.import_module("vitdeploy.stages.precision")  # issue 4's module: calibrate, convert_fp16
    except ImportError:
        raise VitdeployError("this vitdeploy has no precision module: update vitdeploy") from None
    emit("artifact", {"kind": plan.make, "path": str(plan.artifact)})
    made: dict[str, Any] = {"kind": plan.make, "path": str(plan.artifact), "skipped": [], "warnings": []}
    source_manifest = source.manifest  # read before the precision step changes the graph in place
    if plan.make == "int8":  # FP16 for the unquantized parts; for trt10/trt11 with float16 scales (the target's)
        res = precision.calibrate(plan.source, calib, plan.artifact, float_type="fp16",
                                  progress=lambda kind, d: emit(kind, d), target=target, loaded=source.model)
        made["skipped"] = [(str(p), why) for p, why in res.skipped]
        made["warnings"] = list(res.warnings)
        written = res.model
    else:
        written = precision.fp16_artifact(plan.source, plan.artifact, target=target, loaded=source.model).model
    art = onnx_facts(written, plan.artifact)
    emit("check", {"path": str(plan.artifact)})
    made["check"] = compare_artifacts(plan.source, plan.artifact, calib, source_manifest, art.manifest)
    emit("artifact-done", made)
    return made, art


def compare_artifacts(reference: Path, candidate: Path, images: Path, ref_manifest: Manifest | None = None,
                      cand_manifest: Manifest | None = None, limit: int = 64) -> dict[str, Any] | None:
    """How closely ``candidate`` answers like ``reference`` on up to ``limit`` images (ONNX Runtime, CPU).

    None where there are no images to compare on. Labels are not needed: this is agreement, not accuracy.
    """
    import numpy as np

    from vitdeploy.core.images import iter_batches
    from vitdeploy.core.preprocess import list_images
    from vitdeploy.runners.onnxruntime import OnnxRuntimeRunner

    files = list_images(images)[:limit] if Path(images).is_dir() else []
    if not files:
        return None
    ref, cand = OnnxRuntimeRunner(reference, manifest=ref_manifest), OnnxRuntimeRunner(candidate, manifest=cand_manifest)
    a: list[np.ndarray] = []
    b: list[np.ndarray] = []
    for batch in iter_batches(files, ref.manifest.pp(), 32):
        if len(batch.array):
            a.append(ref(batch.array))
            b.append(cand(batch.array))
    if not a:
        return None
    x, y = np.concatenate(a), np.concatenate(b)
    return {
        "images": int(len(x)),
        "top1_agreement": float(np.mean(x.argmax(1) == y.argmax(1))),
        "max_abs_logit_diff": float(np.max(np.abs(x - y))),
        "against": Path(reference).name,
    }


def _logger(trt: Any) -> Any:
    return trt.Logger(trt.Logger.WARNING)


def compile_engine(plan: ArtifactPlan, art: OnnxFacts, env: TensorRTEnv, profile: Profile, o: BuildOptions,
                   emit: Event, made: dict[str, Any] | None = None) -> BuildResult:
    """Parse the artifact, build one plan, write it and its sidecar atomically (and the timing cache)."""
    import tensorrt as trt

    input_name, dims = art.input_name, art.dims
    version = str(trt.__version__)
    nplan = network_plan(version, plan.precision, o.dla_core is not None, o.version_compatible)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt, nplan))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(plan.artifact)):
        errors = [str(parser.get_error(i).desc()) for i in range(parser.num_errors)]
        raise VitdeployError(
            f"{plan.artifact}: TensorRT {version} cannot parse it: {'; '.join(errors)[:300] or 'no reason given'}"
            " (TensorRT 8.5/8.6 read ONNX opsets up to 17: re-export with --opset 17)"
        )
    config = builder.create_builder_config()
    if o.workspace is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(o.workspace * (1 << 30)))
    for flag in nplan.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    if "OBEY_PRECISION_CONSTRAINTS" in nplan.builder_flags:
        pinned = pin_float32_layers(trt, network, art.model)
        emit("pinned", {"layers": pinned})
    if o.dla_core is not None:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = int(o.dla_core)
    mn, op, mx = profile.shapes(dims)
    prof = builder.create_optimization_profile()
    prof.set_shape(input_name, trt.Dims(list(mn)), trt.Dims(list(op)), trt.Dims(list(mx)))
    if config.add_optimization_profile(prof) < 0:
        raise VitdeployError(f"TensorRT refused the batch profile {mn} / {op} / {mx} for input {input_name!r}")
    cache = None
    if o.timing_cache is not None:
        cache = use_timing_cache(config, Path(o.timing_cache), emit)

    emit("build", {"engine": str(plan.engine), "tensorrt": version})
    t0 = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - t0
    if serialized is None:
        raise VitdeployError(f"TensorRT {version} could not build {plan.artifact}: see its messages above")

    options = {
        "min_batch": profile.min, "opt_batch": profile.opt, "max_batch": profile.max,
        "workspace_gib": o.workspace, "timing_cache": str(o.timing_cache) if o.timing_cache else None,
        "dla_core": o.dla_core, "version_compatible": o.version_compatible,
    }
    record = engine_record(
        trt_version=version, gpu_name=env.gpu or "?", compute_capability=env.compute_capability or (0, 0),
        profile=profile, input_name=input_name, input_dims=dims, plan=nplan, options=options,
        build_seconds=seconds, source=plan.artifact, source_sha256=sha256_file(plan.artifact),
        cuda_runtime=env.cuda_runtime,
    )
    record["built_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if made and made.get("check"):
        record["artifact_check"] = made["check"]  # the artifact against FP32 under ONNX Runtime, before the build
    side = sidecar_manifest(art.manifest, record, plan.artifact)
    sidecar = sidecar_path(plan.engine)
    with atomic_path(plan.engine) as tmp_engine, atomic_path(sidecar) as tmp_side:
        with open(tmp_engine, "wb") as f:
            f.write(memoryview(serialized))
        tmp_side.write_text(side.to_json(indent=2) + "\n")
    if cache is not None and o.timing_cache is not None:
        timing = config.get_timing_cache()
        with atomic_path(o.timing_cache) as tmp_cache, open(tmp_cache, "wb") as f:
            f.write(memoryview(timing.serialize()))
    emit("built", {"engine": str(plan.engine), "seconds": seconds})
    return BuildResult(plan.engine, sidecar, plan.artifact, record, made)


def pin_float32_layers(trt: Any, network: Any, model: Any) -> int:
    """On a weakly typed (8.x) FP16/INT8 build, make the graph's float32 islands binding: every Softmax and reduction
    layer and every layer of a LayerNorm (one op, or spelled out for 8.5) computes and outputs FP32 (with
    OBEY_PRECISION_CONSTRAINTS set). Layers are matched to ONNX nodes by name, as onnx-tensorrt names them.
    ``model`` is the artifact's graph (onnx.ModelProto). Returns how many layers were pinned."""
    from vitdeploy.graph.fp16 import fp32_islands

    names = set(fp32_islands(model))
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


def remake_command(model: Path, manifest: Manifest, target: str) -> str:
    """The command that re-makes ``model`` for ``target`` (export for FP32, convert-fp16 / calibrate for the others)."""
    fp32 = model.parent / f"{base_stem(model)}.onnx"
    if manifest.precision == "fp16":
        return f"vitdeploy convert-fp16 {fp32} --target {target}"
    if manifest.precision == "int8":
        return f"vitdeploy calibrate {fp32} --target {target}"
    src = manifest.source or {}
    ckpt = src.get("path") if src.get("kind") == "checkpoint" and src.get("path") else "CHECKPOINT"
    return f"vitdeploy export {ckpt} --target {target} -o {model}"


def target_mismatch(model: Path, manifest: Manifest, trt_version: str) -> None:
    """Refuse an artifact made for another TensorRT target (one line: both targets, the command that re-makes it)."""
    made_for = getattr(manifest, "target", None)
    if not made_for or made_for in CPU_TARGETS:
        return
    here = target_of_version(trt_version)
    if made_for != here:
        raise VitdeployError(
            f"{model} was made for {made_for}, this is TensorRT {trt_version} ({here}): re-make it with "
            f"`{remake_command(model, manifest, here)}`"
        )


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
