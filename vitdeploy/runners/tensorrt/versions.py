"""Everything about engines that needs no TensorRT: profiles, artifact choice, build plans per version,
the sidecar record and the compatibility decision (the printed build commands are in ``commands.py``).

What each TensorRT line can do (max opset, LayerNormalization, float16 scales, strong typing, precision
flags, DLA, trtexec's flags, the Python names) is ONE table, ``vitdeploy.core.trt_table`` over
``core/trt_facts.json``, extracted from NVIDIA's sources by ``scripts/extract_trt_facts.py``; the decisions
here read it rather than repeat it.

Kept free of tensorrt (and of torch) so that it is unit-tested on any CPU and imported on a Jetson
before TensorRT is touched. ``builder.py``, ``runner.py`` and ``stages/engine.py`` are thin layers over it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy.core import trt_table
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.naming import PRECISION_SUFFIXES as PRECISION_SUFFIXES  # noqa: F401 - re-exported
from vitdeploy.core.naming import base_stem as base_stem  # re-exported: callers import it from here
from vitdeploy.runners.tensorrt.probe import import_tensorrt as import_tensorrt  # runner.py imports it here

PRECISIONS = ("fp32", "fp16", "int8")
RECORD_KEY = "engine"  # the sidecar's top-level key for what TensorRT built


def parse_version(v: str | tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """'10.3.0.30' -> (10, 3, 0, 30); trailing text such as 'rc1' or '+cuda12' is ignored."""
    if isinstance(v, (tuple, list)):
        return tuple(int(x) for x in v)
    parts = []
    for piece in str(v).strip().split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    if not parts:
        raise ValueError(f"not a version: {v!r}")
    return tuple(parts)


def version_str(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


# ---------------------------------------------------------------- profile


@dataclass(frozen=True)
class Profile:
    """One optimization profile over the batch dimension."""

    min: int
    opt: int
    max: int

    @property
    def fixed(self) -> bool:
        return self.min == self.max

    def shapes(self, dims: tuple[int, ...] | list[int]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(min, opt, max) input shapes: the batch substituted for the first dimension of ``dims``."""
        rest = tuple(int(d) for d in dims[1:])
        if any(d <= 0 for d in rest):
            raise VitdeployError(f"the model input has dynamic non-batch dimensions {list(dims)}: re-export it with a fixed image size")
        return ((self.min, *rest), (self.opt, *rest), (self.max, *rest))

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def make_profile(min_batch: int = 1, opt_batch: int = 8, max_batch: int = 32, dla_core: int | None = None) -> Profile:
    """The batch profile, refused before any work starts when it cannot be built.

    DLA has no dynamic shapes: with ``dla_core`` the profile is fixed at the optimum batch
    (min = opt = max = ``opt_batch``); the runner pads smaller batches up to it.
    """
    if dla_core is not None:  # min and max do not apply: DLA runs one batch size
        if dla_core < 0:
            raise UsageError(f"--dla-core {dla_core}: a DLA core number is 0 or more")
        if opt_batch < 1:
            raise UsageError(f"--opt-batch {opt_batch}: a batch size must be at least 1")
        return Profile(opt_batch, opt_batch, opt_batch)
    for name, v in (("--min-batch", min_batch), ("--opt-batch", opt_batch), ("--max-batch", max_batch)):
        if int(v) < 1:
            raise UsageError(f"{name} {v}: a batch size must be at least 1")
    if not (min_batch <= opt_batch <= max_batch):
        raise UsageError(
            f"batch profile min {min_batch} / opt {opt_batch} / max {max_batch} breaks min ≤ opt ≤ max: "
            "fix --min-batch, --opt-batch or --max-batch"
        )
    return Profile(int(min_batch), int(opt_batch), int(max_batch))


# ---------------------------------------------------------------- which artifact the engine is built from


@dataclass(frozen=True)
class ArtifactPlan:
    """Which ONNX the engine is built from, whether it must be made first, and where the engine goes."""

    source: Path  # the model the user named
    source_precision: str
    precision: str  # the engine's precision
    artifact: Path  # the ONNX TensorRT parses
    make: str | None  # None: built as it is; "fp16": convert_fp16 first; "int8": calibrate first
    engine: Path


def requested_precision(fp16: bool, int8: bool) -> str | None:
    """``--fp16 --int8`` means INT8 with FP16 for the unquantized parts (what users usually mean)."""
    if int8:
        return "int8"
    if fp16:
        return "fp16"
    return None


def plan_artifact(model: Path, source_precision: str, fp16: bool = False, int8: bool = False, out: Path | None = None,
                  dla_core: int | None = None) -> ArtifactPlan:
    """Decide what ``build-engine`` builds from what it was given; conflicts are usage errors."""
    model = Path(model)
    if source_precision not in PRECISIONS:
        raise VitdeployError(f"{model}: unknown precision {source_precision!r} in its manifest; re-export it")
    want = requested_precision(fp16, int8)
    folder, base = model.parent, base_stem(model)
    if want is None or want == source_precision:
        target, artifact, make = source_precision, model, None
    elif source_precision == "fp32":
        target, artifact, make = want, folder / f"{base}.{want}.onnx", want
    else:
        flag = "--int8" if want == "int8" else "--fp16"
        raise UsageError(
            f"{model} is already {source_precision.upper()}; {flag} starts from the FP32 model: "
            f"pass {folder / (base + '.onnx')} {flag}, or build {model.name} without {flag}"
        )
    if dla_core is not None and target == "fp32":
        raise UsageError("DLA runs FP16 and INT8 only: add --fp16 or --int8 to --dla-core")
    engine = Path(out) if out is not None else folder / f"{base}.{target}.engine"
    if engine.suffix == ".onnx":
        raise UsageError(f"-o {engine}: an engine file ends in .engine (or .plan), not .onnx")
    return ArtifactPlan(model, source_precision, target, artifact, make, engine)


# ---------------------------------------------------------------- what to ask TensorRT for, per version


@dataclass(frozen=True)
class NetworkPlan:
    """Network creation flags and builder flags for one TensorRT version (names of the tensorrt enums)."""

    explicit_batch: bool
    strongly_typed: bool
    builder_flags: tuple[str, ...] = field(default=())


def network_plan(trt_version: tuple[int, ...] | str, precision: str, dla: bool = False,
                 version_compatible: bool = False) -> NetworkPlan:
    """How a decided graph is compiled on a given TensorRT.

    ≥ 9: a strongly typed network, no precision flags (11: every network is strongly typed and the
    FP16/INT8 flags are gone). 8.5/8.6: explicit batch, FP16 for FP16 and INT8 artifacts, INT8 for Q/DQ, and
    OBEY_PRECISION_CONSTRAINTS with them (the builder pins LayerNorm/Softmax/reductions to FP32).
    DLA on 9/10: NVIDIA documents DLA builds with the FP16/INT8 flags there, so a DLA build on 9/10 is
    weakly typed with those flags; on 11 DLA networks are strongly typed too.
    """
    v = parse_version(trt_version)
    major = v[0]
    if major < 8 or v[:2] < (8, 5):
        raise VitdeployError(f"TensorRT {version_str(v)} is too old: vitdeploy needs 8.5 or newer (JetPack 5.1+)")
    if version_compatible and trt_table.value(trt_table.row_of(v), "version_compatible") is not True:
        raise UsageError(f"--version-compatible needs TensorRT 8.6 or newer; this is {version_str(v)}")
    if dla:
        require_dla(v)
    flags: list[str] = []
    precision_flags = (["FP16"] if precision in ("fp16", "int8") else []) + (["INT8"] if precision == "int8" else [])
    if major >= 11:
        strongly, explicit = True, False
    elif major >= 9 and not dla:
        strongly, explicit = True, major < 10
    else:
        strongly, explicit = False, major < 10
        flags += precision_flags
        if precision_flags and trt_table.value(trt_table.row_of(v), "strongly_typed") is not True:
            # 8.x: the graph's float32 islands are only hints under FP16 unless the layers carry a precision
            # (the builder pins them) and the config obeys it (issue 14, defect 3)
            flags.append("OBEY_PRECISION_CONSTRAINTS")
    if dla:
        flags.append("GPU_FALLBACK")
    if version_compatible:
        flags.append("VERSION_COMPATIBLE")
    return NetworkPlan(explicit_batch=explicit, strongly_typed=strongly, builder_flags=tuple(flags))


def require_dla(trt_version: tuple[int, ...] | str) -> None:
    """Refuse a DLA build on a TensorRT without DLA (NVIDIA: 10.7 was the last 10.x with it; 11.0-11.3 none)."""
    v = parse_version(trt_version)
    if trt_table.has_dla(v) is False:
        raise UsageError(
            f"--dla-core: TensorRT {version_str(v)} has no DLA (NVIDIA: 10.7 was the last 10.x with DLA, 11.0-11.3 "
            "have none, 11.4.1+ on JetPack 7.2.2+ only): build for the GPU without --dla-core"
        )


def max_opset(trt_version: tuple[int, ...] | str) -> int | None:
    """The highest ONNX opset this TensorRT's parser reads (from the version table; None: no source read)."""
    return trt_table.max_opset(parse_version(trt_version))[0]


def target_hint(trt_version: tuple[int, ...] | str) -> str:
    from vitdeploy.core.targets import target_of_version

    return target_of_version(parse_version(trt_version))


def opset_problem(opset: int, trt_version: tuple[int, ...] | str) -> str | None:
    """Why this TensorRT's parser cannot read a model of this opset (None: it can), for every version."""
    v = parse_version(trt_version)
    limit = max_opset(v)
    if limit is None or opset <= limit:
        return None
    return (f"the model is ONNX opset {opset}; TensorRT {version_str(v)}'s parser reads opsets up to {limit}: "
            f"re-make it with `vitdeploy export --target {target_hint(v)}` and rebuild the artifact")


# ---------------------------------------------------------------- the sidecar record


def engine_record(*, trt_version: str, gpu_name: str, compute_capability: tuple[int, int], profile: Profile,
                  input_name: str, input_dims: tuple[int, ...] | list[int], plan: NetworkPlan, options: dict[str, Any],
                  build_seconds: float, source: Path, source_sha256: str, cuda_runtime: str | None = None) -> dict[str, Any]:
    """What the sidecar says about the build; the runner checks it before deserializing."""
    mn, op, mx = profile.shapes(input_dims)
    return {
        "tensorrt": trt_version,
        "gpu": gpu_name,
        "compute_capability": f"{compute_capability[0]}.{compute_capability[1]}",
        "cuda_runtime": cuda_runtime,
        "input": input_name,
        "profile": {"min": list(mn), "opt": list(op), "max": list(mx)},
        "strongly_typed": plan.strongly_typed,
        "builder_flags": list(plan.builder_flags),
        "version_compatible": "VERSION_COMPATIBLE" in plan.builder_flags,
        "options": options,
        "build_seconds": round(float(build_seconds), 2),
        "source_onnx": Path(source).name,
        "source_sha256": source_sha256,
    }


def read_record(manifest: Any, engine: Path | str) -> dict[str, Any]:
    rec = manifest.extra.get(RECORD_KEY)
    need = ("tensorrt", "compute_capability", "profile", "input")
    if not isinstance(rec, dict) or any(k not in rec for k in need):
        raise VitdeployError(f"{engine}: its sidecar does not say how it was built; rebuild it with `vitdeploy build-engine`")
    return rec


def record_profile(rec: dict[str, Any]) -> Profile:
    p = rec["profile"]
    return Profile(int(p["min"][0]), int(p["opt"][0]), int(p["max"][0]))


def parse_cc(cc: str | tuple[int, int]) -> tuple[int, int]:
    if isinstance(cc, tuple):
        return (int(cc[0]), int(cc[1]))
    major, _, minor = str(cc).partition(".")
    return (int(major), int(minor or 0))


# Which newer TensorRT majors may load a VERSION_COMPATIBLE plan (NVIDIA: 8.6 → 9/10, 10 → 11).
_FORWARD = {(8, 9), (8, 10), (10, 11)}


def compatibility_problem(rec: dict[str, Any], trt_version: str, compute_capability: tuple[int, int]) -> str | None:
    """None when this TensorRT and GPU can load the engine; else what differs, in words."""
    built = parse_version(rec["tensorrt"])
    here = parse_version(trt_version)
    problems = []
    n = max(3, min(len(built), len(here)))
    same = (built + (0,) * 4)[:n] == (here + (0,) * 4)[:n]
    if not same:
        vc_ok = rec.get("version_compatible") and here > built and (
            built[0] == here[0] or (built[0], here[0]) in _FORWARD)
        if not vc_ok:
            problems.append(f"TensorRT {version_str(built)} built it, this is TensorRT {version_str(here)}")
    cc_built = parse_cc(rec["compute_capability"])
    if cc_built != tuple(compute_capability):
        problems.append(
            f"it was built for compute capability {cc_built[0]}.{cc_built[1]} ({rec.get('gpu', '?')}), "
            f"this GPU is {compute_capability[0]}.{compute_capability[1]}"
        )
    return "; ".join(problems) or None


def require_compatible(engine: Path | str, rec: dict[str, Any], trt_version: str, compute_capability: tuple[int, int]) -> None:
    """Refuse an engine this device cannot load — before TensorRT sees it (no segfault, no 'magic tag')."""
    problem = compatibility_problem(rec, trt_version, compute_capability)
    if problem:
        src = rec.get("source_onnx") or "the .onnx it was built from"
        raise VitdeployError(
            f"{engine}: {problem}. Engines are tied to the TensorRT version and the GPU: "
            f"rebuild it on this device with `vitdeploy build-engine {src}`"
        )
