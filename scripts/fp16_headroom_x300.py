"""Issue 24's FP16 figure: the x300 equivalent of a digits model, converted for trt8.5, judged on the oracle.

    .venv/bin/python scripts/fp16_headroom_x300.py MODEL.onnx DIGITS_FOLDER [CALIBRATION_DIR]

The x300 model (the residual stream scaled by C=300: patch embedding, class token, position embedding, attention-output
and MLP-output weights by C, LayerNorm eps by C^2) is built by tests/test_numerics.py's ``scaled_residual`` (loaded by
path, so the test and this script build the same model). Prints the numerics record convert-fp16 wrote and top-1 /
drop / agreement of the trt8.5 FP16 artifact on the oracle against the FP32 model on DIGITS_FOLDER's val/ images.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    from vitdeploy.checks.guard import load_eval_set
    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.runners.onnxruntime import OnnxRuntimeRunner
    from vitdeploy.runners.oracle.runner import OracleRunner
    from vitdeploy.stages.precision import convert_fp16

    src, digits = Path(sys.argv[1]), Path(sys.argv[2])
    calib = Path(sys.argv[3]) if len(sys.argv) > 3 else REPO / "calibration"
    sys.path.insert(0, str(REPO / "tests"))
    spec = importlib.util.spec_from_file_location("numerics_tests", REPO / "tests" / "test_numerics.py")
    assert spec is not None and spec.loader is not None
    tn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tn)
    work = Path(tempfile.mkdtemp(prefix="x300-"))
    art = OnnxArtifact.open(src)
    OnnxArtifact.write(tn.scaled_residual(art.load_weights(), tn.C), art.manifest, work / "x300.onnx")
    out = convert_fp16(work / "x300.onnx", work / "x300.fp16.onnx", target="trt8.5", images=calib)
    rec = OnnxArtifact.open(out).manifest.extra.get("numerics") or {}
    print(f"numerics: {len(rec.get('overflow', []))} tensors over FP16's headroom, {len(rec.get('kept_fp32_nodes', []))} nodes "
          f"kept float32 ({json.dumps(rec.get('kept_fp32_nodes', [])[:2])} ...)")
    ev = load_eval_set(digits, art.manifest)

    def logits(r: object) -> np.ndarray:
        return np.concatenate([r.run(ev.x[i : i + 64]) for i in range(0, len(ev.x), 64)])  # type: ignore[attr-defined]

    ref, big, got = logits(OnnxRuntimeRunner(src)), logits(OnnxRuntimeRunner(work / "x300.onnx")), logits(OracleRunner(out))
    top1 = lambda z: 100 * float((z.argmax(1) == ev.y).mean())  # noqa: E731
    print(f"C={tn.C:g}: x300 vs FP32 max |dlogit| {np.abs(big - ref).max():.2e}; {len(ev.y)} images; FP32 top-1 "
          f"{top1(ref):.2f}; trt8.5 FP16 of x300 on the oracle: top-1 {top1(got):.2f} (drop {top1(ref) - top1(got):.2f} pt), "
          f"agreement {100 * float((got.argmax(1) == ref.argmax(1)).mean()):.2f}%")


if __name__ == "__main__":
    main()
