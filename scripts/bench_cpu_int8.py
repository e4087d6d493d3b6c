"""Issue 32's figures: the CPU INT8 (``calibrate -t cpu``, our placement) against NNCF's INT8 of the same model.

Speed (``--preset vit-small``/``vit-base``, random weights: speed does not depend on the weights' values; random
calibration images): OpenVINO on our CPU INT8, OpenVINO on NNCF's INT8 (``nncf.quantize`` on the OpenVINO model of the
same FP32 ONNX, ``model_type=TRANSFORMER``, every other default: what OpenVINO's user makes in one call), OpenVINO
FP32 — these three in one process, rounds interleaved — then ONNX Runtime FP32 and ONNX Runtime on our INT8 in a
second process, rounds interleaved. Every row: one stream, ``--threads`` threads, float32 float parts. Printed: img/s
(all the calls of a row / their time), the slowest and fastest round, and the ratios ours/NNCF and ours/ORT FP32.

Accuracy (``--accuracy``): on the trained digits ViT (tests/artifact_cache.py's checkpoint: set VITDEPLOY_TEST_CACHE
to share it) and on its exactly equivalent 50× LayerNorm-spread copy (tests/helpers.py ``with_spread``), every INT8
run on OpenVINO against OpenVINO FP32 on the digits val split (360 images): our -t cpu INT8 (no guard), NNCF's INT8
on its OpenVINO path (as above) and on its ONNX path (``nncf.quantize`` on the ONNX model), all calibrated on the same
number of digits train images.

    python scripts/bench_cpu_int8.py --preset vit-small --batch-sizes 8,1 --threads 2 --seconds 20 --accuracy
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


# --- artifacts -----------------------------------------------------------------------------------


def build(preset: str, folder: Path, calib_images: int, seed: int) -> dict[str, Path]:
    """The preset's FP32 export (random weights), our CPU INT8 and NNCF's INT8 IR of it, reused when present."""
    from vitdeploy.model.presets import get_preset
    from vitdeploy.stages.export import export_onnx
    from vitdeploy.stages.precision import calibrate
    from vitdeploy.tools.bench import _random_checkpoint, _random_images, nncf_anchor

    folder.mkdir(parents=True, exist_ok=True)
    fp32 = folder / "model.onnx"
    if not fp32.exists():
        export_onnx(_random_checkpoint(preset, folder, seed), out=fp32, check=False)
    calib = folder / "calibration"
    if not calib.exists():
        h, w = get_preset(preset).preprocess["input_size"]
        _random_images(calib, calib_images, (int(h), int(w)), seed)
    ours = folder / "model.cpu.int8.onnx"
    if not ours.exists():
        calibrate(fp32, images=calib, out=ours, num_images=calib_images, batch_size=8, seed=seed, target="cpu")
    xml = folder / "nncf.int8.xml"
    if not xml.exists():
        nncf_anchor(fp32, folder, calib, num_images=calib_images, seed=seed)
    return {"fp32": fp32, "ours": ours, "nncf": xml}


# --- speed: one process per runtime, rounds interleaved --------------------------------------------


def rows_worker(runtime: str, spec: list[str], threads: int, batch: int, seconds: float, rounds: int,
                size: tuple[int, int]) -> dict[str, Any]:
    """Each ``name=path`` row of ``runtime`` opened in this process, then ``rounds`` rounds in turn, each row running
    ``seconds / rounds`` per round. {name: [per-call seconds of each round]}."""
    calls: dict[str, Any] = {}
    if runtime == "openvino":
        import openvino as ov

        core = ov.Core()
        cfg = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
               "INFERENCE_PRECISION_HINT": "f32"}
        for s in spec:
            name, path = s.split("=", 1)
            req = core.compile_model(core.read_model(path), "CPU", cfg).create_infer_request()
            calls[name] = lambda x, r=req: r.infer({0: x})
        default_hint = str(core.get_property("CPU", "INFERENCE_PRECISION_HINT"))
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        for s in spec:
            name, path = s.split("=", 1)
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            inp = sess.get_inputs()[0].name
            calls[name] = lambda x, se=sess, i=inp: se.run(None, {i: x})
        default_hint = None
    x = np.random.default_rng(0).standard_normal((batch, 3, *size), dtype=np.float32)
    for f in calls.values():
        for _ in range(2):
            f(x)
    times: dict[str, list[list[float]]] = {n: [] for n in calls}
    for _ in range(rounds):
        for n, f in calls.items():
            spent, ts = 0.0, []
            while spent < seconds / rounds:
                t = time.perf_counter()
                f(x)
                ts.append(time.perf_counter() - t)
                spent += ts[-1]
            times[n].append(ts)
    return {"times": times, "load": os.getloadavg()[0], "openvino_default_hint": default_hint}


def run_rows(runtime: str, rows: dict[str, Path], a: argparse.Namespace, batch: int,
             size: tuple[int, int]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", runtime, "--threads", str(a.threads), "--batch", str(batch),
           "--seconds", str(a.seconds), "--rounds", str(a.rounds), "--size", f"{size[0]},{size[1]}",
           *[f"{n}={p}" for n, p in rows.items()]]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def speed(a: argparse.Namespace, folder: Path) -> None:
    from vitdeploy.core.artifact import read_onnx_manifest

    arts = build(a.preset, folder, a.calib_images, a.seed)
    size = tuple(read_onnx_manifest(arts["fp32"]).input_size)
    print(f"{a.preset}, random weights, {a.calib_images} random calibration images; {a.threads} threads, one stream, "
          f"f32 float parts; {a.rounds} interleaved rounds, {a.seconds:g} s per row per batch size")
    for b in [int(v) for v in a.batch_sizes.split(",")]:
        load0 = os.getloadavg()[0]
        ov = run_rows("openvino", {"OpenVINO FP32": arts["fp32"], "OpenVINO ours -t cpu INT8": arts["ours"],
                                   "OpenVINO NNCF INT8": arts["nncf"]}, a, b, size)  # type: ignore[arg-type]
        rt = run_rows("onnxruntime", {"ORT FP32": arts["fp32"], "ORT ours -t cpu INT8": arts["ours"]}, a, b,
                      size)  # type: ignore[arg-type]
        ips: dict[str, float] = {}
        print(f"\nbatch {b}  (load average {load0:.1f} before, {ov['load']:.1f} after OpenVINO, {rt['load']:.1f} "
              f"after ORT; OpenVINO's default precision hint here: {ov['openvino_default_hint']})")
        print(f"{'row':<28} {'img/s':>7}  rounds (img/s)")
        for res in (ov, rt):
            for name, per_round in res["times"].items():
                flat = [t for r in per_round for t in r]
                ips[name] = b * len(flat) / sum(flat)
                rr = [b * len(r) / sum(r) for r in per_round]
                print(f"{name:<28} {ips[name]:>7.2f}  {min(rr):.2f}-{max(rr):.2f}")
        ours = ips["OpenVINO ours -t cpu INT8"]
        print(f"OpenVINO ours / OpenVINO NNCF INT8 = {ours / ips['OpenVINO NNCF INT8']:.2f}x")
        print(f"OpenVINO ours / ORT FP32           = {ours / ips['ORT FP32']:.2f}x")
        print(f"OpenVINO ours / OpenVINO FP32      = {ours / ips['OpenVINO FP32']:.2f}x")
        print(f"ORT ours / ORT FP32                = {ips['ORT ours -t cpu INT8'] / ips['ORT FP32']:.2f}x")


# --- accuracy ------------------------------------------------------------------------------------


def ov_logits(model: Path | str, x: np.ndarray) -> np.ndarray:
    import openvino as ov

    core = ov.Core()
    req = core.compile_model(core.read_model(str(model)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
    return np.concatenate([np.array(req.infer({0: x[i : i + 64]})[0]) for i in range(0, len(x), 64)])


def accuracy(a: argparse.Namespace, folder: Path) -> None:
    import onnx

    sys.path.insert(0, str(ROOT / "tests"))
    import artifact_cache
    from helpers import with_spread

    from vitdeploy.checks.guard import figures, load_eval_set
    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.core.manifest import set_onnx_manifest
    from vitdeploy.graph.nncf_ptq import nncf_quantize
    from vitdeploy.model.data import write_digits
    from vitdeploy.model.imageset import ImageSet
    from vitdeploy.stages.precision import calibrate
    from vitdeploy.tools.bench import nncf_anchor

    digits = folder / "digits"
    if not (digits / "val").is_dir():
        write_digits(digits)
    train, val = digits / "train", digits / "val"
    src = artifact_cache.fp32_entry() / "model.onnx"
    man = OnnxArtifact.open(src).manifest
    models = {"digits ViT": folder / "digits.onnx", "50x spread": folder / "spread.onnx"}
    onnx.save(onnx.load(str(src)), str(models["digits ViT"]))
    spread = with_spread(onnx.load(str(src)), 50.0, [3, 17, 42, 77])
    set_onnx_manifest(spread, man.derive(precision="fp32"))
    onnx.save(spread, str(models["50x spread"]))
    ev = load_eval_set(val, man)
    n = a.acc_images
    print(f"\naccuracy on the digits val split ({len(ev.y)} images), every model on OpenVINO (f32 float parts) "
          f"against OpenVINO FP32; {n} digits train images calibrate each INT8 (seed {a.seed})")
    print(f"{'model':<12} {'INT8':<36} {'top-1':>7} {'drop pt':>8} {'agreement':>10}")
    for label, path in models.items():
        ref = ov_logits(path, ev.x)
        ours = calibrate(path, train, folder / f"{path.stem}.cpu.int8.onnx", num_images=n, seed=a.seed, target="cpu")
        xml, _ = nncf_anchor(path, folder / f"{path.stem}-nncf-ov", train, num_images=n, seed=a.seed)
        art = OnnxArtifact.open(path)
        calib = ImageSet.folder(train, n, a.seed)
        q = nncf_quantize(art.load_weights(), [b.array for b in calib.batches(man.pp(), 16)])
        nncf_onnx = folder / f"{path.stem}.nncf-onnx.int8.onnx"
        onnx.save(q, str(nncf_onnx))
        print(f"{label:<12} {'FP32':<36} {float(np.mean(ref.argmax(1) == ev.y)):>7.2%}")
        for name, m in (("ours: calibrate -t cpu (no guard)", ours.path), ("NNCF, OpenVINO path", xml),
                        ("NNCF, ONNX path", nncf_onnx)):
            f = figures(ref, ov_logits(m, ev.x), ev.y)
            print(f"{label:<12} {name:<36} {f.int8_top1:>7.2%} {f.drop_points:>8.2f} {f.agreement:>10.2%}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="vit-small", help="vit-small, vit-base, ... (none: accuracy only)")
    ap.add_argument("--batch-sizes", default="8,1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0, help="per row per batch size, split over the rounds")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calib-images", type=int, default=64, help="random calibration images (speed)")
    ap.add_argument("--acc-images", type=int, default=128, help="digits train images calibrating each INT8 (accuracy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--folder", type=Path, help="keep (and reuse) the artifacts here")
    ap.add_argument("--accuracy", action="store_true", help="also the digits ViT and 50x spread accuracy table")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--size", help=argparse.SUPPRESS)
    ap.add_argument("rows", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        h, w = (int(v) for v in a.size.split(","))
        print(json.dumps(rows_worker(a.worker, a.rows, a.threads, a.batch, a.seconds, a.rounds, (h, w))))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-cpu-int8-") as tmp:
        folder = a.folder or Path(tmp)
        if a.preset != "none":
            speed(a, folder / a.preset)
        if a.accuracy:
            accuracy(a, folder / "accuracy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
