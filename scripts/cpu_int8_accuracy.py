"""Top-1 drop and agreement vs FP32 of our INT8 graphs (TensorRT placement and --target ort) on both CPU runtimes.

    PYTHONPATH=$PWD python scripts/cpu_int8_accuracy.py CKPT WORKDIR

Exports CKPT, calibrates from the repository's calibration/ digits, and measures on the digits val split
(the guarded artifact is tuned on that same split: `calibrate --eval DIR --max-drop 0.3 --min-agreement 0.99
--backend openvino --target ort`).
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    from vitdeploy.checks.guard import load_eval_set
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.model.data import write_digits
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.export import export_onnx
    from vitdeploy.stages.precision import calibrate

    ckpt, d = Path(sys.argv[1]), Path(sys.argv[2])
    d.mkdir(parents=True, exist_ok=True)
    calib = Path(__file__).resolve().parents[1] / "calibration"
    fp32 = d / "model.onnx"
    if not fp32.exists():
        export_onnx(ckpt, out=fp32)
    if not (d / "digits").exists():
        write_digits(d / "digits")
    arts = {"trt placement": d / "model.int8.onnx", "--target ort": d / "model.ort.int8.onnx"}
    if not arts["trt placement"].exists():
        calibrate(fp32, calib, arts["trt placement"])
    if not arts["--target ort"].exists():
        calibrate(fp32, calib, arts["--target ort"], target="ort")
    # the guard, evaluating on OpenVINO (where it runs): layers are kept in float until the targets hold
    arts["--target ort, guarded"] = d / "model.ort.guarded.int8.onnx"
    if not arts["--target ort, guarded"].exists():
        res = calibrate(fp32, calib, arts["--target ort, guarded"], target="ort", eval_dir=d / "digits", max_drop=0.3,
                        min_agreement=0.99, backend="openvino")
        print(f"guard (--target ort) kept in float: {res.excluded}")
    arts["trt placement, guarded"] = d / "model.guarded.int8.onnx"
    if not arts["trt placement, guarded"].exists():
        res = calibrate(fp32, calib, arts["trt placement, guarded"], eval_dir=d / "digits", max_drop=0.3,
                        min_agreement=0.99, backend="openvino")
        print(f"guard (trt placement) kept in float: {res.excluded}")
    ev = load_eval_set(d / "digits", read_onnx_manifest(fp32))
    with open_runner(fp32, backend="onnxruntime") as r:
        ref = r(ev.x)
    top_ref = float((ref.argmax(1) == ev.y).mean())
    print(f"{ckpt}: {len(ev.y)} val images, FP32 top-1 {100 * top_ref:.2f}%")
    for name, p in arts.items():
        for backend in ("onnxruntime", "openvino"):
            with open_runner(p, backend=backend) as r:
                q = r(ev.x)
            top = float((q.argmax(1) == ev.y).mean())
            agree = float((q.argmax(1) == ref.argmax(1)).mean())
            print(f"  INT8 {name:<22} on {backend:<11}: top-1 {100 * top:.2f}%  drop {100 * (top_ref - top):+.2f} pt  "
                  f"agreement {100 * agree:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
