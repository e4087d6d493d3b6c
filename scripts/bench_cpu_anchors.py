"""Our best CPU INT8 against OpenVINO + NNCF's INT8 on the same model, in one run, and the ratios.

    PYTHONPATH=$PWD python scripts/bench_cpu_anchors.py [--folder DIR] [--batch-sizes 8,1] [--seconds 20]

The model is vit-small/16 at 224 with random weights (speed does not depend on the weights' values) and
random calibration images; accuracy is measured elsewhere (README "calibrate --target ort"). Rows:
ONNX Runtime and OpenVINO on the FP32 export, on our INT8 for TensorRT (the default placement) and on our
INT8 for the CPU (``calibrate -t cpu``: our CPU placement) and NNCF's scheme on the ONNX graph as
``calibrate -t cpu --quantizer nncf`` makes it, and OpenVINO on NNCF's INT8 (``nncf.quantize``,
ModelType.TRANSFORMER, the same calibration images) with OpenVINO's default precision (bfloat16 float parts
where the CPU has AVX512-BF16/AMX) and with f32 (as our runner runs our graphs). Each row runs in its own
process (ONNX Runtime's and OpenVINO's thread pools slow each other in one), the rows' rounds alternate,
and the ratios are taken within the run. nncf is in the `cpu` extra.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def anchor_worker(xml: Path, threads: int, hint: str) -> Any:
    """NNCF's IR as a row (tools/bench_worker.py serves an OpenVINO IR: the same row `benchmark --versus nncf` shows)."""
    from vitdeploy.tools.bench import Worker

    return Worker([sys.executable, "-m", "vitdeploy.tools.bench_worker", str(xml), "openvino", str(threads), hint,
                   f"nncf-int8 ({hint})", "224", "224"])


def build(folder: Path, calib_images: int, seed: int) -> dict[str, Path]:
    """The FP32 export, our two INT8 graphs and NNCF's INT8 IR, from one random-weight vit-small."""
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.core.images import iter_batches
    from vitdeploy.core.preprocess import list_images
    from vitdeploy.stages.export import export_onnx
    from vitdeploy.stages.precision import calibrate
    from vitdeploy.tools.bench import _random_checkpoint, _random_images

    folder.mkdir(parents=True, exist_ok=True)
    fp32 = folder / "model.onnx"
    if not fp32.exists():
        ckpt = _random_checkpoint("vit-small", folder, seed)
        export_onnx(ckpt, out=fp32, check=False)
    calib = folder / "calibration"
    if not calib.exists():
        _random_images(calib, calib_images, (224, 224), seed)
    out = {"fp32": fp32, "int8-trt": folder / "model.int8-trt.onnx", "int8-ort": folder / "model.int8-ort.onnx"}
    if not out["int8-trt"].exists():
        calibrate(fp32, images=calib, out=out["int8-trt"], num_images=calib_images, batch_size=8, seed=seed)
    if not out["int8-ort"].exists():  # the CPU INT8 (-t cpu): our CPU placement (Q·Kᵀ quantized)
        calibrate(fp32, images=calib, out=out["int8-ort"], num_images=calib_images, batch_size=8, seed=seed,
                  target="cpu")
    out["int8-cpu"] = folder / "model.cpu-nncf.int8.onnx"
    if not out["int8-cpu"].exists():  # `calibrate -t cpu --quantizer nncf`: NNCF's scheme on the ONNX graph
        calibrate(fp32, images=calib, out=out["int8-cpu"], num_images=calib_images, batch_size=8, seed=seed,
                  target="cpu", quantizer="nncf")
    xml = folder / "nncf.int8.xml"
    if not xml.exists():
        import nncf
        import openvino as ov

        pp = read_onnx_manifest(fp32).pp()
        data = [b.array[i : i + 1] for b in iter_batches(list_images(calib), pp, 8) for i in range(len(b.paths))]
        q = nncf.quantize(ov.Core().read_model(str(fp32)), nncf.Dataset(data), model_type=nncf.ModelType.TRANSFORMER,
                          subset_size=len(data))
        ov.save_model(q, str(xml))
    out["nncf"] = xml
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, help="keep (and reuse) the artifacts here")
    ap.add_argument("--batch-sizes", default="8,1")
    ap.add_argument("--seconds", type=float, default=20.0, help="per row and batch size, split over --rounds")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calib-images", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    from vitdeploy.core.host import available_cores
    from vitdeploy.tools.bench import Worker, cpu_flags, cpu_model, measure_workers

    threads = a.threads or available_cores()
    with tempfile.TemporaryDirectory(prefix="vitdeploy-anchors-") as tmp:
        arts = build(a.folder or Path(tmp), a.calib_images, a.seed)
        rows = [
            ("ORT FP32", Worker.for_row(arts["fp32"], "onnxruntime", threads, "cpu")),
            ("OpenVINO FP32", Worker.for_row(arts["fp32"], "openvino", threads, "cpu")),
            ("ORT INT8 (ours, trt placement)", Worker.for_row(arts["int8-trt"], "onnxruntime", threads, "cpu")),
            ("ORT INT8 (ours, -t cpu)", Worker.for_row(arts["int8-ort"], "onnxruntime", threads, "cpu")),
            ("OpenVINO INT8 (ours, trt placement)", Worker.for_row(arts["int8-trt"], "openvino", threads, "cpu")),
            ("OpenVINO INT8 (ours, -t cpu)", Worker.for_row(arts["int8-ort"], "openvino", threads, "cpu")),
            ("ORT INT8 (--quantizer nncf)", Worker.for_row(arts["int8-cpu"], "onnxruntime", threads, "cpu")),
            ("OpenVINO INT8 (--quantizer nncf)", Worker.for_row(arts["int8-cpu"], "openvino", threads, "cpu")),
            ("OpenVINO NNCF INT8 (OV default precision)", anchor_worker(arts["nncf"], threads, "default")),
            ("OpenVINO NNCF INT8 (f32 float parts)", anchor_worker(arts["nncf"], threads, "f32")),
        ]
        try:
            for name, w in rows:
                if w.error:
                    raise SystemExit(f"{name}: {w.error}")
            print(f"{cpu_model()} ({', '.join(cpu_flags())}), {threads} threads; load before: {os.getloadavg()}")
            print("vit-small/16 at 224, random weights; each row in its own process, rounds interleaved")
            for b in [int(v) for v in a.batch_sizes.split(",")]:
                times = measure_workers([w for _, w in rows], b, warmup=2, seconds=a.seconds, rounds=a.rounds)
                ips = {name: b * len(ts) / sum(ts) for (name, _), ts in zip(rows, times, strict=True)}
                med = {name: b / float(np.median(ts)) for (name, _), ts in zip(rows, times, strict=True)}
                base = ips["ORT FP32"]
                print(f"\nbatch {b}  (load now {os.getloadavg()[0]:.1f})")
                print(f"{'row':<44} {'img/s':>7} {'img/s@p50':>9} {'x ORT FP32':>10} {'peak MB':>8}")
                for name, w in rows:
                    print(f"{name:<44} {ips[name]:>7.2f} {med[name]:>9.2f} {ips[name] / base:>10.2f} {w.peak_rss_mb:>8.0f}")
                ours_rows = [n for n, _ in rows if "(ours" in n]
                best = max(ours_rows, key=lambda n: ips[n])
                ours = ips[best]
                print(f"our best CPU INT8: {best}")
                print(f"  / ORT FP32                                   = {ours / base:.2f}x")
                print(f"  / OpenVINO NNCF INT8 (OV default precision)  = {ours / ips['OpenVINO NNCF INT8 (OV default precision)']:.2f}x")
                print(f"  / OpenVINO NNCF INT8 (f32 float parts)       = {ours / ips['OpenVINO NNCF INT8 (f32 float parts)']:.2f}x")
                cpu = ips["OpenVINO INT8 (ours, -t cpu)"]
                print(f"  OpenVINO -t cpu / NNCF INT8 (OV default)     = {cpu / ips['OpenVINO NNCF INT8 (OV default precision)']:.2f}x")
                print(f"  OpenVINO -t cpu / ORT FP32                   = {cpu / base:.2f}x")
        finally:
            for _, w in rows:
                w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
