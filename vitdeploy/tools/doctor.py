"""What this machine can do: Python packages, the backends ``auto`` would pick (OpenVINO, ONNX Runtime, TensorRT,
torch), CUDA GPU, Jetson, DLA, and which commands work.

Nothing here imports torch or tensorrt unless it has to: versions come from
package metadata, the GPU from the one GPU probe (``runners/tensorrt/cuda.gpu_probe``: the CUDA driver through
ctypes, which works on a Jetson, where nvidia-smi may be missing, and says "no GPU" in the words build-engine,
infer and benchmark use), the Jetson release from /etc/nv_tegra_release, the device tree and dpkg. Every probe
returns what it found and why not, never raises.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# L4T release → JetPack; TensorRT per JetPack from TENSORRT.md (the unconfirmed ones say so).
L4T_JETPACK = [
    ("32.7", "4.6.x", "8.2.1"),
    ("35.1", "5.0.2", "8.4.1"),
    ("35.2", "5.1", "8.5.2"),
    ("35.3", "5.1.1", "8.5.2"),
    ("35.4", "5.1.2", "8.5.2"),
    ("35.5", "5.1.3", "8.5.2"),
    ("35.6", "5.1.4", "8.5.2"),
    ("36.3", "6.0", "8.6.2 (unconfirmed)"),
    ("36.4", "6.1 / 6.2", "10.3"),
    ("38.2", "7.0", "10.13 (unconfirmed)"),
]

PACKAGES = ("numpy", "pillow", "torch", "onnx", "onnxruntime", "onnxruntime-gpu", "openvino", "tensorrt", "cuda-python",
            "pycuda", "tritonclient")


@dataclass
class Report:
    python: dict[str, Any]
    packages: dict[str, str | None]
    onnxruntime: dict[str, Any]
    tensorrt: dict[str, Any]
    cuda: dict[str, Any]
    jetson: dict[str, Any]
    dla: dict[str, Any]
    commands: list[dict[str, str]] = field(default_factory=list)
    target: dict[str, Any] = field(default_factory=dict)
    backends: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def probe_onnxruntime() -> dict[str, Any]:
    try:
        import onnxruntime as ort
    except Exception as e:  # noqa: BLE001 - a broken install is a finding, not a crash
        return {"available": False, "why": f"cannot import onnxruntime ({type(e).__name__}: {e})"[:200], "providers": []}
    return {"available": True, "version": ort.__version__, "providers": list(ort.get_available_providers()), "device": ort.get_device()}


def find_trtexec() -> str | None:
    return shutil.which("trtexec") or next((p for p in ("/usr/src/tensorrt/bin/trtexec",) if os.access(p, os.X_OK)), None)


def probe_tensorrt() -> dict[str, Any]:
    """TensorRT's Python bindings (the package may install without the libraries it needs) and trtexec."""
    out: dict[str, Any] = {"available": False, "trtexec": find_trtexec()}
    libs = sorted(glob.glob("/usr/lib/*-linux-gnu/libnvinfer.so.*")) + sorted(glob.glob("/usr/lib/libnvinfer.so.*"))
    if libs:
        out["libnvinfer"] = libs[-1]
    from vitdeploy.runners.tensorrt.probe import import_tensorrt

    trt = import_tensorrt()
    if isinstance(trt, str):
        out["why"] = trt
    else:
        out.update(available=True, version=str(trt.__version__))
        from vitdeploy.runners.tensorrt.errors import cuda_failure, is_cuda_failure

        try:  # the bindings load without CUDA; a Runtime needs it (nullptr TypeError when CUDA cannot start)
            trt.Runtime(trt.Logger(trt.Logger.ERROR))
        except TypeError as e:
            if not is_cuda_failure(e):
                raise
            out.update(available=False, why=str(cuda_failure("trt.Runtime", str(trt.__version__))))
    return out


def probe_cuda() -> dict[str, Any]:
    """The GPUs and driver CUDA version, from the one GPU probe (libcuda: works on a Jetson, where nvidia-smi may be
    missing); ``why`` is the same reason build-engine, infer and benchmark give."""
    from vitdeploy.runners.tensorrt.cuda import gpu_list, gpu_probe

    found = gpu_probe()
    if not found.available:
        return {"available": False, "why": found.why, "gpus": [], "driver_cuda_version": found.driver_cuda_version}
    out: dict[str, Any] = {"available": True, "driver_cuda_version": found.driver_cuda_version, "gpus": gpu_list(found)}
    smi = shutil.which("nvidia-smi")  # the driver's own version, where nvidia-smi is (not on every Jetson)
    if smi:
        try:
            r = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
            if r.returncode == 0 and r.stdout.strip():
                out["driver_version"] = r.stdout.split()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def parse_tegra_release(text: str) -> str | None:
    """'# R35 (release), REVISION: 4.1, ...' → '35.4.1'."""
    m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def jetpack_for(l4t: str) -> tuple[str | None, str | None]:
    for prefix, jp, trt in L4T_JETPACK:
        if l4t == prefix or l4t.startswith(prefix + "."):
            return jp, trt
    return None, None


def probe_jetson(root: str | Path = "/") -> dict[str, Any]:
    r = Path(root)
    out: dict[str, Any] = {"is_jetson": False}
    model_file = r / "proc/device-tree/model"
    model = None
    if model_file.exists():
        try:
            model = model_file.read_bytes().rstrip(b"\0").decode(errors="replace").strip()
        except OSError:
            pass
    l4t = None
    rel = r / "etc/nv_tegra_release"
    if rel.exists():
        try:
            l4t = parse_tegra_release(rel.read_text(errors="replace"))
        except OSError:
            pass
    if l4t is None and str(r) == "/" and shutil.which("dpkg-query"):
        try:
            p = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "nvidia-l4t-core"], capture_output=True, text=True, timeout=10)
            if p.returncode == 0 and p.stdout:
                l4t = p.stdout.split("-")[0]
        except (OSError, subprocess.SubprocessError):
            pass
    if l4t or (model and "jetson" in model.lower()):
        out["is_jetson"] = True
        out["model"] = model
        out["l4t"] = l4t
        if l4t:
            jp, trt = jetpack_for(l4t)
            out["jetpack"] = jp
            out["jetpack_tensorrt"] = trt
    else:
        out["why"] = "not a Jetson (no /etc/nv_tegra_release, device-tree model is not a Jetson)"
    return out


def probe_dla(root: str | Path = "/", tensorrt_ok: bool = False) -> dict[str, Any]:
    """DLA cores: from TensorRT's builder where it loads, else the device nodes Jetson exposes."""
    if tensorrt_ok:
        try:
            import tensorrt as trt  # type: ignore[import-not-found]

            n = trt.Builder(trt.Logger(trt.Logger.ERROR)).num_DLA_cores
            return {"cores": int(n), "from": "tensorrt"}
        except Exception:  # noqa: BLE001 - fall back to the device nodes
            pass
    r = Path(root)
    nodes = sorted({Path(p).name for p in glob.glob(str(r / "dev/nvhost-nvdla*")) if not p.endswith("-ctrl")})
    if not nodes:
        nodes = sorted(glob.glob(str(r / "sys/devices/platform/*nvdla*")) + glob.glob(str(r / "sys/devices/platform/bus@0/*nvdla*")))
    return {"cores": len(nodes), "from": "device nodes"}


def engine_missing(trt: dict[str, Any], cuda: dict[str, Any]) -> str | None:
    """Why no engine is built or run here, worded as build-engine words it (runners/tensorrt/probe.probe), or None."""
    why = [str(d.get("why") or "unavailable") for d in (trt, cuda) if not d.get("available")]
    return ", and ".join(why) or None


def probe_backends(pk: dict[str, str | None], ort_info: dict[str, Any], trt: dict[str, Any],
                   cuda: dict[str, Any]) -> list[dict[str, Any]]:
    """Every backend, whether it runs here, and which artifacts ``auto`` gives it (runners.default_backend, infer's
    auto-pick): OpenVINO for ONNX on the CPU where installed, else ONNX Runtime; TensorRT for engines only where
    TensorRT and a GPU are; torch for checkpoints."""
    from vitdeploy.runners.openvino.loader import INSTALL_HINT, openvino_installed

    ov = openvino_installed()
    ort_ok = bool(ort_info.get("available"))
    engine_why = engine_missing(trt, cuda)
    rows = [
        {"backend": "openvino", "available": ov, "version": pk.get("openvino"),
         "auto_picks": "ONNX models on the CPU" if ov else "", "why": None if ov else f"not installed: {INSTALL_HINT}"},
        {"backend": "onnxruntime", "available": ort_ok, "version": ort_info.get("version"),
         "auto_picks": ("ONNX models with --device cuda" if ov else "ONNX models") if ort_ok else "",
         "why": None if ort_ok else ort_info.get("why")},
        {"backend": "tensorrt", "available": engine_why is None, "version": trt.get("version"),
         "auto_picks": "engines (first, before any ONNX model)" if engine_why is None else "",
         "why": engine_why},
        {"backend": "torch", "available": pk.get("torch") is not None, "version": pk.get("torch"),
         "auto_picks": "checkpoints" if pk.get("torch") else "", "why": None if pk.get("torch") else "not installed"},
    ]
    return rows


def command_support(pk: dict[str, str | None], ort_info: dict[str, Any], trt: dict[str, Any], cuda: dict[str, Any]) -> list[dict[str, str]]:
    """Which vitdeploy commands work here: 'yes', 'partly' or 'no', and why (engines: build-engine's own reason)."""
    torch, onnx_ok, ort_ok = pk.get("torch") is not None, pk.get("onnx") is not None, ort_info.get("available", False)
    gpu = cuda.get("available", False)
    engine_why = engine_missing(trt, cuda)
    engine_ok = engine_why is None
    rows: list[tuple[str, str, str]] = []

    def add(cmd: str, ok: bool, why_not: str, partly: bool = False, partly_why: str = "", why_ok: str = "") -> None:
        state = "yes" if ok and not partly else ("partly" if ok else "no")
        rows.append((cmd, state, partly_why if state == "partly" else (why_ok if ok else why_not)))

    add("train", torch, "needs torch", partly=torch and not gpu, partly_why="CPU only (no CUDA GPU)", why_ok="CPU and CUDA")
    add("import / explain", torch, "needs torch", why_ok="Hugging Face / timm checkpoints, attention maps")
    add("export", torch and onnx_ok, "needs torch and onnx", why_ok="checkpoint → ONNX")
    add("calibrate / convert-fp16", onnx_ok and ort_ok, "needs onnx and onnxruntime", why_ok="INT8 Q/DQ and FP16 ONNX, measured on ONNX Runtime")
    add("build-engine", onnx_ok, "needs onnx", partly=not engine_ok,
        partly_why=f"writes the INT8/FP16 ONNX, not the engine (exit 3): {engine_why}", why_ok="TensorRT engine for this GPU")
    runs = [n for n, ok in (("checkpoints", torch), ("ONNX", ort_ok), ("engines", engine_ok)) if ok]
    add("infer / verify / benchmark", bool(runs), "needs torch, onnxruntime or TensorRT", partly=not engine_ok,
        partly_why=f"on {', '.join(runs)}; not engines: {engine_why}", why_ok="checkpoints, ONNX and engines")
    add("bundle", onnx_ok and ort_ok, "needs onnx and onnxruntime", why_ok="Jetson bundle, Triton repository, DeepStream config")
    add("doctor", True, "", why_ok="this report")
    return [{"command": c, "works": s, "why": w} for c, s, w in rows]


ARTIFACT_KINDS = ("fp32", "fp16", "int8", "raw-pixel", "deepstream")


def machine_target(trt: dict[str, Any], cuda: dict[str, Any], jetson: dict[str, Any]) -> dict[str, Any]:
    """This machine's target (from its TensorRT, else from its JetPack's) and what it can build.

    Engines for every artifact kind are built only where TensorRT and a GPU are; elsewhere the artifacts for any
    target are written here and built on the target. DLA per the version table (core/trt_table.py).
    """
    from vitdeploy.core import trt_table
    from vitdeploy.core.targets import target_of_version

    version, via = None, None
    if trt.get("available") and trt.get("version"):
        version, via = str(trt["version"]), "installed TensorRT"
    elif jetson.get("jetpack_tensorrt"):
        version, via = str(jetson["jetpack_tensorrt"]).split()[0], f"JetPack {jetson.get('jetpack')}'s TensorRT"
    engines = bool(trt.get("available") and cuda.get("available"))
    if version is None:
        return {"target": None, "cpu_target": "cpu",
                "why": "no TensorRT here, so this machine runs the cpu target (ONNX Runtime or OpenVINO on the CPU); "
                       f"every artifact kind ({', '.join(ARTIFACT_KINDS)}) is made here for any target with --target "
                       "(trt8.5, trt8.6, trt10, trt11, cpu, openvino) and its engine is built on the device",
                "engines": {k: "no" for k in ARTIFACT_KINDS}, "dla": None}
    try:
        target = target_of_version(version)
        row = trt_table.row_of(version)
    except ValueError as e:
        return {"target": None, "why": str(e), "engines": {k: "no" for k in ARTIFACT_KINDS}, "dla": None}
    dla = trt_table.has_dla(version)
    state = "yes" if engines else "artifacts only (no TensorRT and GPU to build engines here)"
    return {"target": target, "tensorrt": version, "from": via, "row": row,
            "max_opset": trt_table.max_opset(version)[0], "dla": dla,
            "engines": {k: state for k in ARTIFACT_KINDS}}


def doctor(root: str | Path = "/") -> Report:
    """One look at what this machine can run; ``root`` lets tests point the Jetson probes at a fake tree."""
    pk = package_versions()
    ort_info = probe_onnxruntime()
    trt = probe_tensorrt()
    cuda = probe_cuda()
    jet = probe_jetson(root)
    dla = probe_dla(root, tensorrt_ok=trt["available"] and cuda["available"])
    py = {"version": platform.python_version(), "executable": sys.executable, "machine": platform.machine(),
          "system": f"{platform.system()} {platform.release()}"}
    return Report(py, pk, ort_info, trt, cuda, jet, dla, command_support(pk, ort_info, trt, cuda),
                  machine_target(trt, cuda, jet), probe_backends(pk, ort_info, trt, cuda))
