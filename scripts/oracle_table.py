"""Issue 24's table with the oracle column: top-1 / drop / agreement vs FP32 on the oracle, ONNX Runtime and OpenVINO.

For the digits ViT (preset vit-digits, `vitdeploy train` defaults), exported, calibrated with and without
`--target trt10` from 512 real digit images, and for the "50× spread" model: an exact FP32 equivalent whose
LayerNorm γ/β of a few channels are scaled by K=50 and the consuming MatMul's rows divided by K. Every runtime
runs in its own process (ONNX Runtime's and OpenVINO's thread pools slow each other in one process).

    .venv/bin/python scripts/oracle_table.py [--work DIR] [--epochs N] [--channels 4] [--k 50]

Prints one markdown table and, per artifact, how far the oracle's logits are from OpenVINO's. Nothing is
hard-coded: every figure is measured by the run that prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("oracle", "onnxruntime", "openvino")


def worker(backend: str, artifact: str, x_path: str, out_path: str) -> None:
    """One runtime, one artifact, in this process only: logits of x written to out_path."""
    from vitdeploy.runners.base import Runner

    x = np.load(x_path)
    r: Runner
    if backend == "oracle":
        from vitdeploy.runners.oracle.runner import OracleRunner

        r = OracleRunner(artifact)
    else:
        from vitdeploy.runners import open_runner

        r = open_runner(artifact, backend)
    out = np.concatenate([r.run(x[i : i + 64]) for i in range(0, len(x), 64)])
    np.save(out_path, out.astype(np.float32))


def logits_in_process(backend: str, artifact: Path, x_path: Path, work: Path) -> np.ndarray:
    out = work / f"logits-{artifact.stem}-{backend}.npy"
    subprocess.run([sys.executable, __file__, "--worker", backend, str(artifact), str(x_path), str(out)], check=True)
    return np.load(out)


def vitdeploy(*args: str, cwd: Path) -> None:
    exe = Path(sys.executable).with_name("vitdeploy")
    subprocess.run([str(exe), *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL)


def spread_model(src: Path, dst: Path, k: float, channels: int) -> int:
    """The exact FP32 equivalent with a K× spread between LayerNorm output channels (issue 24's construction):
    γ[c], β[c] × K for the first ``channels`` channels of every LayerNorm whose outputs only feed MatMuls with a
    constant weight, and those weights' rows c ÷ K. Returns how many LayerNorms were changed."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(src))
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    changed = 0
    for n in g.node:
        if n.op_type != "LayerNormalization" or len(n.input) < 3 or n.input[1] not in inits or n.input[2] not in inits:
            continue
        users = consumers.get(n.output[0], [])
        if not users or any(u.op_type != "MatMul" or u.input[0] != n.output[0] or u.input[1] not in inits for u in users):
            continue
        gamma, beta = numpy_helper.to_array(inits[n.input[1]]).copy(), numpy_helper.to_array(inits[n.input[2]]).copy()
        gamma[:channels] *= k
        beta[:channels] *= k
        inits[n.input[1]].CopyFrom(numpy_helper.from_array(gamma, n.input[1]))
        inits[n.input[2]].CopyFrom(numpy_helper.from_array(beta, n.input[2]))
        for u in users:
            w = numpy_helper.to_array(inits[u.input[1]]).copy()
            w[:channels, :] /= k
            inits[u.input[1]].CopyFrom(numpy_helper.from_array(w, u.input[1]))
        changed += 1
    onnx.save(m, str(dst))
    return changed


def figures(logits: np.ndarray, ref: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    top1 = 100.0 * float(np.mean(logits.argmax(1) == y))
    ref1 = 100.0 * float(np.mean(ref.argmax(1) == y))
    agree = 100.0 * float(np.mean(logits.argmax(1) == ref.argmax(1)))
    return top1, ref1 - top1, agree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("oracle-table"))
    ap.add_argument("--epochs", type=int, default=None, help="training epochs (default: vitdeploy train's)")
    ap.add_argument("--k", type=float, default=50.0)
    ap.add_argument("--channels", type=int, default=4)
    ap.add_argument("--modelopt", type=Path, default=None, metavar="PYTHON",
                    help="a Python with nvidia-modelopt[onnx] (its own venv: it pins onnx/onnxruntime-gpu): adds its INT8 rows")
    ap.add_argument("--worker", nargs=4, metavar=("BACKEND", "ARTIFACT", "X", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(*a.worker)
        return
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    w = a.work.resolve()
    w.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not (w / "ckpt.pth").exists() and not (w / "model.onnx").exists():  # a folder with model.onnx reuses it
        vitdeploy("train", *(["--epochs", str(a.epochs)] if a.epochs else []), cwd=w)
    if not (w / "model.onnx").exists():
        vitdeploy("export", "ckpt.pth", cwd=w)
    if not (w / "digits" / "val").exists():
        vitdeploy("datasets", "digits", "digits", cwd=w)
    if not (w / "calibration").exists():
        shutil.copytree(REPO / "calibration", w / "calibration")  # real digit scans, as scripts/demo.sh uses
    spread = w / "spread.onnx"
    if not spread.exists():
        n = spread_model(w / "model.onnx", spread, a.k, a.channels)
        print(f"spread model: {n} LayerNorms, first {a.channels} channels × {a.k:g}")
    rows = [("ours, no target", "model.onnx", "model.int8.onnx", []),
            ("ours, --target trt10", "model.onnx", "model.trt10.int8.onnx", ["--target", "trt10"]),
            (f"{a.k:g}× spread: ours, no target", "spread.onnx", "spread.int8.onnx", []),
            (f"{a.k:g}× spread: ours, --target trt10", "spread.onnx", "spread.trt10.int8.onnx", ["--target", "trt10"]),
            (f"{a.k:g}× spread: ours, --target trt10 --smooth off", "spread.onnx", "spread.trt10.nosmooth.int8.onnx",
             ["--target", "trt10", "--smooth", "off"]),
            (f"{a.k:g}× spread: ours, --target trt10 --eval --max-drop 0.5 (guard on the oracle)", "spread.onnx",
             "spread.trt10.guard.int8.onnx", ["--target", "trt10", "--eval", "digits", "--max-drop", "0.5"]),
            (f"{a.k:g}× spread: ours, no target --eval --max-drop 0.5 (guard on ONNX Runtime)", "spread.onnx",
             "spread.guard-ort.int8.onnx", ["--eval", "digits", "--max-drop", "0.5", "--backend", "onnxruntime"]),
            (f"{a.k:g}× spread: ours, no target --eval --max-drop 0.5 (guard on OpenVINO)", "spread.onnx",
             "spread.guard-ov.int8.onnx", ["--eval", "digits", "--max-drop", "0.5", "--backend", "openvino"])]
    for _, src, out, extra in rows:
        if not (w / out).exists():
            vitdeploy("calibrate", src, "-o", out, "--num-images", "512", *extra, cwd=w)
    if a.modelopt is not None:  # NVIDIA ModelOpt's ONNX PTQ on the same 512 calibration images (entropy, fp16 float)
        calib_x = w / "calib-x.npy"
        if not calib_x.exists():
            from vitdeploy.core.artifact import read_onnx_manifest as _read
            from vitdeploy.model.imageset import ImageSet

            _, cx, _ = ImageSet.folder(w / "calibration", 512, 0).arrays(_read(w / "model.onnx").pp())
            np.save(calib_x, cx)
        for label, src in (("ModelOpt", "model.onnx"), (f"{a.k:g}× spread: ModelOpt", "spread.onnx")):
            out = src.replace(".onnx", ".modelopt.int8.onnx")
            if not (w / out).exists():
                code = ("import numpy as np; from modelopt.onnx.quantization import quantize; "
                        f"quantize({str(w / src)!r}, 'int8', calibration_data=np.load({str(calib_x)!r}), "
                        "calibration_method='entropy', calibration_eps=['cpu'], high_precision_dtype='fp16', "
                        f"output_path={str(w / out)!r}, log_level='ERROR')")
                subprocess.run([str(a.modelopt), "-c", code], check=True, cwd=w)
                import onnx

                from vitdeploy.core.artifact import OnnxArtifact

                # ModelOpt writes no vitdeploy manifest: give it its source's (INT8, for TensorRT 10+ strongly typed
                # builds, which is what its fp16 float parts are made for), so every runner reads it alike
                src_art = OnnxArtifact.open(w / src)
                mo = onnx.load(str(w / out))
                OnnxArtifact.write(mo, src_art.manifest.derive(precision="int8", target="trt10",
                                                               source=src_art.source_record(), tool="nvidia-modelopt"),
                                   w / out)
            rows.append((label, src, out, []))

    from vitdeploy.checks.guard import load_eval_set
    from vitdeploy.core.artifact import read_onnx_manifest

    ev = load_eval_set(w / "digits", read_onnx_manifest(w / "model.onnx"))
    x_path = w / "val-x.npy"
    np.save(x_path, ev.x)
    ref = {s: logits_in_process("onnxruntime", w / s, x_path, w) for s in ("model.onnx", "spread.onnx")}
    equiv = float(np.max(np.abs(ref["model.onnx"] - ref["spread.onnx"])))
    print(f"{len(ev.y)} validation images; FP32 top-1 {figures(ref['model.onnx'], ref['model.onnx'], ev.y)[0]:.2f}; "
          f"spread model vs FP32: max |Δlogit| {equiv:.2e}")
    print()
    print("| artifact | " + " | ".join(BACKENDS) + " |")
    print("|---|" + "---|" * len(BACKENDS))
    notes = []
    for label, src, out, _ in rows:
        got = {b: logits_in_process(b, w / out, x_path, w) for b in BACKENDS}
        cells = ["{:.2f} / {:.2f} / {:.2f}".format(*figures(got[b], ref[src], ev.y)) for b in BACKENDS]
        print(f"| {label} | " + " | ".join(cells) + " |")
        d = np.abs(got["oracle"] - got["openvino"])
        flips = int(np.sum(got["oracle"].argmax(1) != got["openvino"].argmax(1)))
        notes.append(f"{label}: oracle vs OpenVINO max |Δlogit| {d.max():.3e} (logit range {np.abs(got['openvino']).max():.2f}),"
                     f" top-1 differs on {flips} image(s)")
    print()
    print("cells: top-1 % / drop in points vs FP32 / top-1 agreement with FP32 %")
    for line in notes:
        print(line)
    from importlib import metadata

    vers = {p: metadata.version(p) for p in ("onnxruntime", "openvino", "numpy")}
    print(json.dumps({"versions": vers, "seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main()
