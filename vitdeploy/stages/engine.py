"""ONNX → TensorRT plan, from the precision artifacts; imports tensorrt lazily.

The engine step compiles a decided graph and makes no numeric decisions of its own: ``--int8`` and
``--fp16`` only choose (or first make, through ``vitdeploy.stages.precision``) the ONNX whose graph carries
the precision. The plan is written as TensorRT serialized it — no header — so trtexec, Triton and
DeepStream load it; ``<engine>.json`` beside it holds the manifest and how it was built. Where
TensorRT or a GPU is missing, the precision artifact is still written and ``EngineNotBuilt``
(exit 3) carries the commands that finish the job on the target.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitdeploy.checks.compare import artifact_agreement
from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.errors import OpsetTooNew, PartlyDone, StaleArtifact, TargetMismatch, UsageError, VitdeployError
from vitdeploy.core.lineage import is_stale, remake_command
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.preprocess import list_images
from vitdeploy.core.targets import CPU_TARGETS, resolve_target, target_of_version
from vitdeploy.model.imageset import ImageSet
from vitdeploy.runners.tensorrt.builder import BuildSpec, Event, compile_engine, dla_cores
from vitdeploy.runners.tensorrt.commands import finish_commands
from vitdeploy.runners.tensorrt.probe import TensorRTEnv as TensorRTEnv  # re-exported: older imports name it here
from vitdeploy.runners.tensorrt.probe import probe
from vitdeploy.runners.tensorrt.versions import (
    ArtifactPlan,
    make_profile,
    network_plan,
    opset_problem,
    plan_artifact,
)

CHECK_IMAGES = 64  # images the made artifact is checked on against its FP32 source


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
    facts = resolve_target(o.target)  # once per command: a JetPack or module name becomes its TensorRT line
    source = OnnxArtifact.open(model)  # the one read of the source: manifest, opset and input come from it
    manifest = source.manifest
    plan = plan_artifact(model, manifest.precision, o.fp16, o.int8, o.out, o.dla_core)
    check_build_outputs(plan, model, o)
    in_the_way(plan, model, o.out is not None)
    if plan.make is not None and plan.artifact.exists():
        kept_guard(plan.artifact)
    # (without the default calibration/ folder, calibrate falls back to the digits for a digits model)
    if plan.make == "int8" and not Path(o.calib).is_dir() and Path(o.calib) != Path("calibration"):
        raise VitdeployError(
            f"{o.calib}: no such folder of calibration images: put a few hundred images like the ones "
            "the model will see there, or pass --calib DIR"
        )

    env = probe()
    if env.missing is None:  # refuse what this device cannot do before any calibration or build starts
        network_plan(env.version or "0", plan.precision, o.dla_core is not None, o.version_compatible)
        if o.dla_core is not None:
            n = dla_cores(env)
            if o.dla_core >= n:
                raise UsageError(
                    f"--dla-core {o.dla_core}: this device has {n} DLA core{'s' if n != 1 else ''}"
                    + (" (Jetson Orin has them; Thor, Nano and desktop GPUs have none)" if n == 0 else "")
                )

    target = facts.name if facts is not None else None
    if env.missing is None:  # an artifact made for another TensorRT: say so before calibrating or building
        target_mismatch(model, manifest, env.version or "0")
        here = target_of_version(env.version or "0")
        if target is not None and target != here:
            raise TargetMismatch(f"--target {target}, but this is TensorRT {env.version} ({here}): build with "
                                 f"--target {here} here, or on a device with {target}")
        target = here
    elif target is None:
        target = manifest.target
    if env.missing is None:  # a parser that cannot read the opset: say so before calibrating or building
        problem = opset_problem(source.opset, env.version or "0")
        if problem:
            raise OpsetTooNew(f"{plan.artifact}: {problem}")
    made, art = make_artifact(plan, source, Path(o.calib), emit, target)
    build = BuildSpec(plan.artifact, plan.engine, art.input.name, list(art.input.dims), profile, plan.precision,
                      o.workspace, o.timing_cache, o.dla_core, o.version_compatible)
    if env.missing is not None:
        raise EngineNotBuilt(plan.artifact, made, env.missing, finish_commands(build, art.opset, refusal(art)))
    problem = opset_problem(art.opset, env.version or "0")
    if problem:
        raise OpsetTooNew(f"{plan.artifact} is written, but {problem}")
    notes = {"artifact_check": made["check"]} if made and made.get("check") else None  # against FP32, under ORT
    built = compile_engine(build, env, art.manifest, art.model, emit, notes)
    return BuildResult(built.engine, built.sidecar, plan.artifact, built.record, made)


def refusal(art: OnnxArtifact) -> Callable[[str], str | None]:
    """Why a TensorRT version would not build ``art`` as intended (checks.conformance, the rules `check-target` runs:
    its parser's operators and opset, and for INT8 the strongly typed build's float16 scales), or None."""
    from vitdeploy.checks import conformance

    def why(version: str) -> str | None:
        target = target_of_version(version)
        for rep in (conformance.check_onnx(art.model, target), conformance.check_int8_intent(art.model, target)):
            if not rep.ok:
                if not rep.findings:
                    return f"fails {target}"
                f = rep.findings[0]  # named by its rule and place, never cut mid-word; check-target says it whole
                more = f" and {len(rep.findings) - 1} more" if len(rep.findings) > 1 else ""
                return (f"fails check-target's {f.check} rule at {f.where}{more} "
                        f"(`vitdeploy check-target {art.path.name} -t {target}` says why)")
        return None

    return why


def in_the_way(plan: Any, model: Path, engine_named: bool) -> None:
    """Refuse (exit 1, before any work) a file at a name build-engine chose that is not made from ``model``, its input
    (core/lineage.descends_from): the INT8/FP16 ONNX it would make or reuse, and the engine it would write unless
    ``-o`` named it. A stale one (made from an earlier ``model``) is re-made as before."""
    from vitdeploy.core.lineage import require_descends

    if plan.make is not None:
        cmd = "calibrate" if plan.make == "int8" else "convert-fp16"
        require_descends(plan.artifact, model, "build-engine", remake=f"vitdeploy {cmd} {model} -o {plan.artifact}")
    if not engine_named:
        require_descends(plan.engine, model, "build-engine",
                         remake=f"vitdeploy build-engine {model}{' --' + plan.make if plan.make else ''} -o {plan.engine}")


def kept_guard(artifact: Path) -> None:
    """Refuse to replace an INT8 artifact that `calibrate` checked with the accuracy guard by an unguarded one."""
    try:
        manifest = OnnxArtifact.open_manifest(artifact)
    except VitdeployError:
        return  # not a vitdeploy model: replaced as any stale output
    guard = manifest.extra.get("guard")
    if guard and is_stale(artifact, manifest):  # guarded, but from an earlier FP32 model: never built silently
        budget = "".join(f" --{k.replace('_points', '').replace('_', '-')} {guard[k]}" for k in ("max_drop_points", "min_agreement", "min_cosine")
                         if guard.get(k) is not None)
        fp32 = artifact.parent / str((manifest.source or {}).get("artifact") or "model.onnx")
        raise StaleArtifact(
            f"{artifact} was calibrated with the accuracy guard from an earlier {fp32.name}: re-make it with "
            f"`vitdeploy calibrate {fp32} --eval {guard.get('eval', 'DIR')}{budget}`, then build it"
        )
    if guard:
        raise UsageError(
            f"{artifact} exists and was calibrated with the accuracy guard: build it as it is "
            f"(`vitdeploy build-engine {artifact}`), or remove it to calibrate anew"
        )


def make_artifact(plan: ArtifactPlan, source: OnnxArtifact, calib: Path, emit: Event,
                  target: str | None = None) -> tuple[dict[str, Any] | None, OnnxArtifact]:
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
        res = precision.calibrate(source, calib, plan.artifact, float_type="fp16",
                                  progress=lambda kind, d: emit(kind, d), target=target)
        made["skipped"] = [(str(p), why) for p, why in res.skipped]
        made["warnings"] = list(res.warnings)
        art = res.artifact
        images = res.image_set.head(CHECK_IMAGES) if res.image_set is not None else None  # decoded once, reused
    else:
        art = precision.fp16_artifact(source, plan.artifact, target=target)
        images = ImageSet.for_model(source_manifest, calib if calib.is_dir() and list_images(calib) else None, CHECK_IMAGES)
    emit("check", {"path": str(plan.artifact), "total": len(images) if images is not None else 0})
    made["check"] = (artifact_agreement(plan.source, source_manifest, art, images, target)
                     if images is not None else None)
    emit("artifact-done", made)
    return made, art


def target_mismatch(model: Path, manifest: Manifest, trt_version: str) -> None:
    """Refuse an artifact made for another TensorRT target (one line: both targets, the command that re-makes it)."""
    made_for = getattr(manifest, "target", None)
    if not made_for or made_for in CPU_TARGETS:
        return
    here = target_of_version(trt_version)
    if made_for != here:
        raise TargetMismatch(
            f"{model} was made for {made_for}, this is TensorRT {trt_version} ({here}): re-make it with "
            f"`{remake_command(model, manifest, here)}`"
        )


def check_build_outputs(plan: Any, model: Path, o: BuildOptions) -> None:
    """Every file build-engine may write goes through the one output check, before any work (core/outputs.py): the
    precision artifact it makes and its calibration cache, the engine (-o or its default name), its sidecar, and the
    rejected plan with its sidecar. The timing cache is read and updated: written by rename like every output."""
    from vitdeploy.core.fileio import check_output
    from vitdeploy.core.outputs import check_side_outputs

    inputs = [model, o.calib, o.timing_cache]
    if o.timing_cache is not None:  # read, then replaced by the updated cache: never the model or the images
        check_output(o.timing_cache, [model, o.calib], option="--timing-cache")
    if plan.make is not None:
        check_output(plan.artifact, inputs, option="the precision artifact")
        if plan.make == "int8":
            check_side_outputs(plan.artifact, ["calibration cache"], inputs, option="the precision artifact")
    check_output(plan.engine, inputs, option="-o" if o.out else "the engine")
    check_side_outputs(plan.engine, ["engine sidecar", "rejected engine", "rejected engine sidecar"], inputs,
                       option="-o" if o.out else "the engine")
