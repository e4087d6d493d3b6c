"""The command lines that build an engine elsewhere: `vitdeploy build-engine` and trtexec per TensorRT release.

build-engine prints them where TensorRT or a GPU is missing (exit 3): the artifact is ready, these finish the
job on the target. They are made from the same ``BuildSpec`` ``compile_engine`` takes, so each line builds
what vitdeploy would. trtexec's options per release come from the version table (``core/trt_table.py`` over
``core/trt_facts.json``, read from NVIDIA's trtexec sources).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from vitdeploy.core import trt_table
from vitdeploy.runners.tensorrt.builder import BuildSpec
from vitdeploy.runners.tensorrt.versions import base_stem, max_opset, opset_problem, parse_version, target_hint


def _shape(s: tuple[int, ...]) -> str:
    return "x".join(map(str, s))


def _q(p: Path | str) -> str:
    return shlex.quote(str(p))


def vitdeploy_command(spec: BuildSpec) -> str:
    """The `vitdeploy build-engine` line that builds ``spec.artifact`` as is (its precision is in the graph)."""
    parts = ["vitdeploy", "build-engine", _q(spec.artifact)]
    if spec.dla_core is not None:
        parts += ["--opt-batch", str(spec.profile.opt), "--dla-core", str(spec.dla_core)]
    else:
        parts += ["--min-batch", str(spec.profile.min), "--opt-batch", str(spec.profile.opt),
                  "--max-batch", str(spec.profile.max)]
    if spec.workspace is not None:
        parts += ["--workspace", f"{spec.workspace:g}"]
    if spec.timing_cache is not None:
        parts += ["--timing-cache", _q(spec.timing_cache)]
    if spec.version_compatible:
        parts.append("--version-compatible")
    parts += ["-o", _q(spec.engine)]
    return " ".join(parts)


def trtexec_command(spec: BuildSpec, trt_version: str) -> str:
    """The equivalent trtexec line for a given TensorRT version (trtexec writes no sidecar)."""
    plan = spec.network_plan(trt_version)
    mn, op, mx = spec.profile.shapes(spec.dims)
    parts = ["trtexec", f"--onnx={_q(spec.artifact)}"]
    parts += [_q(f"--{k}Shapes={spec.input_name}:{_shape(s)}") for k, s in (("min", mn), ("opt", op), ("max", mx))]
    if plan.strongly_typed:
        parts.append("--stronglyTyped")
    flag_opts = {"FP16": "--fp16", "INT8": "--int8", "VERSION_COMPATIBLE": "--versionCompatible"}
    parts += [flag_opts[f] for f in plan.builder_flags if f in flag_opts]
    if spec.dla_core is not None:
        parts += [f"--useDLACore={spec.dla_core}", "--allowGPUFallback"]
    if spec.workspace is not None:
        parts.append(f"--memPoolSize=workspace:{round(spec.workspace * 1024)}")  # MiB, understood by 8.5 … 11
    if spec.timing_cache is not None:
        parts.append(f"--timingCacheFile={_q(spec.timing_cache)}")
    parts.append(f"--saveEngine={_q(spec.engine)}")
    build_only = trt_table.value(trt_table.row_of(parse_version(trt_version)), "trtexec_build_only")
    if build_only in ("--buildOnly", "--skipInference"):  # 8.5 knows only --buildOnly, 8.6+ --skipInference
        parts.append(build_only)
    return " ".join(parts)


def finish_commands(spec: BuildSpec, opset: int | None = None,
                    refuses: Callable[[str], str | None] | None = None) -> list[str]:
    """The lines that finish the job on the target: vitdeploy (writes the sidecar), then trtexec per TensorRT version;
    with ``opset``, a note for each version whose parser cannot read it. ``refuses(version)``: why that TensorRT would
    not build the artifact as intended (the stage's conformance check), or None; such a version gets no trtexec
    line, only the command that re-makes the artifact for it, so no line we print builds something else."""
    lines = [vitdeploy_command(spec)]
    variants: list[tuple[str, str]]
    if spec.dla_core is None:
        variants = [("TensorRT 10+", "10.0")]
    else:  # DLA only where it exists: 8.5/8.6 (JetPack 5/6.0), 10.0-10.7 (JetPack 6), 11.4.1+ (JetPack 7.2.2+)
        variants = [("TensorRT 11.4.1+ (JetPack 7.2.2+)", "11.4.1"), ("TensorRT 10.0-10.7", "10.0")]
    variants.append(("TensorRT 8.6", "8.6") if spec.version_compatible else ("TensorRT 8.5/8.6", "8.5"))
    if refuses is not None and ("TensorRT 8.5/8.6", "8.5") in variants and (refuses("8.5") is None) != (refuses("8.6") is None):
        i = variants.index(("TensorRT 8.5/8.6", "8.5"))  # one line each where the two parsers differ on this artifact
        variants[i : i + 1] = [("TensorRT 8.6", "8.6"), ("TensorRT 8.5", "8.5")]
    for label, version in variants:
        why = refuses(version) if refuses is not None else None
        if why is None:
            lines.append(f"# or, {label}:  {trtexec_command(spec, version)}")
        else:
            fp32 = spec.artifact.parent / (base_stem(spec.artifact) + ".onnx")
            remake = (f"vitdeploy build-engine {_q(fp32)} --{spec.precision} --target {target_hint(version)}"
                      if spec.precision in ("int8", "fp16") else f"vitdeploy export CHECKPOINT --target {target_hint(version)}")
            lines.append(f"# not for {label} as made ({why}): re-make it for that TensorRT with `{remake}`")
    if opset is not None:
        for label, version in variants:
            if opset_problem(opset, version):
                lines.append(f"# note: {spec.artifact} is ONNX opset {opset}: {label} reads opsets up to "
                             f"{max_opset(version)} and cannot build it (`vitdeploy export --target "
                             f"{target_hint(version)}` makes one it can)")
    return lines

