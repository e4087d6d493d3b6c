#!/usr/bin/env python3
"""FP32 vs INT8 (vs FP16) ONNX Runtime CPU throughput, side by side in one process, interleaved, as ratios.

    .venv/bin/python scripts/bench_precision.py                      # vit-small/16 at 224, batch 8
    .venv/bin/python scripts/bench_precision.py --preset vit-digits --fp16 --rounds 20
    .venv/bin/python scripts/bench_precision.py --accuracy-sweep ckpt.pth  # accuracy of every method (digits)

Builds a random-weight checkpoint of the preset, exports it with vitdeploy's
exporter, calibrates INT8 with vitdeploy.stages.precision.calibrate on real photographs
(scikit-image's samples, cropped at random), and times every model in turn for
``--rounds`` rounds of ``--iters`` calls each, so load from other processes hits
them alike. Prints images/s (median over rounds) and INT8/FP32 (and FP16/FP32)
throughput ratios; the target for vit-small at batch 8 is INT8 ≥ 2× FP32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def photos(folder: Path, n: int, seed: int) -> Path:
    """n random crops of scikit-image's sample photographs (real images, any size)."""
    from PIL import Image
    from skimage import data

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    srcs = [np.asarray(Image.fromarray(getattr(data, k)()).convert("RGB")) for k in ("astronaut", "coffee", "chelsea", "rocket", "camera")]
    for i in range(n):
        dest = folder / f"photo_{i:03d}.jpg"
        a = srcs[i % len(srcs)]
        h, w = a.shape[:2]
        s = int(rng.integers(min(h, w) // 3, min(h, w)))
        y, x = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
        if not dest.exists():  # kept files keep their calibration cache valid
            Image.fromarray(a[y : y + s, x : x + s]).save(dest, quality=92)
    return folder


def accuracy_sweep(ckpt: Path, folder: Path) -> None:
    """Every calibration method, with and without the attention matmuls quantized, plus FP16: top-1 and agreement
    against FP32 on the digits validation split (the measurements behind the defaults)."""
    from vitdeploy.checks.guard import figures, load_eval_set, logits
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.model.data import write_digits
    from vitdeploy.stages.export import export_onnx
    from vitdeploy.stages.precision import calibrate, convert_fp16

    calib = Path(__file__).resolve().parents[1] / "calibration"
    folder.mkdir(parents=True, exist_ok=True)
    fp32 = folder / "model.onnx"
    if not fp32.exists():
        export_onnx(ckpt, fp32)
    if not (folder / "digits").exists():
        write_digits(folder / "digits")
    print(f"{ckpt} on the digits validation split; calibration: {calib} (500 real digit images)")
    print(f"{'artifact':38s} {'top-1':>7s} {'drop':>6s} {'agree':>7s} {'max|Δlogit|':>12s}")
    ev = load_eval_set(folder / "digits", read_onnx_manifest(fp32))
    ref = logits(fp32, ev.x)
    h = convert_fp16(fp32, folder / "model.fp16.onnx")
    f = figures(ref, logits(h, ev.x), ev.y)
    print(f"{'fp32':38s} {f.fp32_top1:7.2%}")
    print(f"{'fp16':38s} {f.int8_top1:7.2%} {f.drop_points:6.2f} {f.agreement:7.2%} {f.max_abs_logit_diff:12.2e}"
          f"   (max |logit| {np.abs(ref).max():.2f})")
    for att in (False, True):
        for method in ("minmax", "percentile", "entropy"):
            r = calibrate(fp32, calib, folder / "model.int8.onnx", method=method, quantize_attention=att,
                          eval_dir=folder / "digits")
            g = r.figures
            name = f"int8 {method}{' +attention' if att else ''}"
            print(f"{name:38s} {g['int8_top1']:7.2%} {g['drop_points']:6.2f} {g['agreement']:7.2%} "
                  f"{g['max_abs_logit_diff']:12.2e}")
    r = calibrate(fp32, calib, folder / "model.int8.onnx", eval_dir=folder / "digits", max_drop=0.5, min_agreement=0.99)
    g = r.figures
    print(f"{'int8 default + guard (0.5 pt, 99%)':38s} {g['int8_top1']:7.2%} {g['drop_points']:6.2f} "
          f"{g['agreement']:7.2%} {g['max_abs_logit_diff']:12.2e}   kept in float: {', '.join(r.excluded) or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="vit-small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--iters", type=int, default=2, help="calls per model per round")
    ap.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: one per core)")
    ap.add_argument("--no-spin", action="store_true",
                    help="the runners' session settings with session.intra_op.allow_spinning=0 (idle threads sleep "
                         "instead of spinning: what a CPU shared with other work wants)")
    ap.add_argument("--calib-images", type=int, default=64)
    ap.add_argument("--method", default=None)
    ap.add_argument("--quantize-attention", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--fp16", action="store_true", help="also time the FP16 ONNX")
    ap.add_argument("--both-attention", action="store_true",
                    help="time INT8 without and with the attention matmuls quantized (int8, int8-att)")
    ap.add_argument("--keep", type=Path, default=None, help="folder to keep (and reuse) the artifacts in")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--accuracy-sweep", type=Path, default=None, metavar="CKPT",
                    help="instead of timing: export CKPT (a digits checkpoint) and print top-1/agreement of FP16 and of "
                         "INT8 for every method, with and without attention quantized, and with the guard")
    a = ap.parse_args()
    if a.accuracy_sweep:
        with tempfile.TemporaryDirectory(prefix="precision-sweep-") as t:
            accuracy_sweep(a.accuracy_sweep, a.keep or Path(t))
        return

    import torch

    from vitdeploy.core.manifest import Manifest
    from vitdeploy.model.checkpoint import save_checkpoint
    from vitdeploy.model.vit import VisionTransformer, get_preset
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.export import export_onnx
    from vitdeploy.stages.precision import calibrate, convert_fp16

    tmp = tempfile.TemporaryDirectory(prefix="bench-precision-")
    d = a.keep or Path(tmp.name)
    d.mkdir(parents=True, exist_ok=True)
    p = get_preset(a.preset)
    fp32 = d / "model.onnx"
    if not fp32.exists():
        torch.manual_seed(0)
        model = VisionTransformer(p.config).eval()
        man = Manifest(model=p.config.to_dict(), labels=[f"class_{i}" for i in range(p.config.num_classes)],
                       preprocess=dict(p.preprocess), name=a.preset)
        save_checkpoint(d / "ckpt.pth", model, man)
        export_onnx(d / "ckpt.pth", fp32, check=False)
    kw = {}
    if a.method:
        kw["method"] = a.method
    if a.quantize_attention is not None:
        kw["quantize_attention"] = a.quantize_attention
    t = time.perf_counter()
    res = calibrate(fp32, photos(d / "calibration", a.calib_images, 0), d / "model.int8.onnx",
                    num_images=a.calib_images, batch_size=min(16, a.calib_images), **kw)
    q = res.manifest.extra["quantization"]
    print(f"calibrated in {time.perf_counter() - t:.0f} s: {q['method']}, attention quantized: {q['quantize_attention']}, "
          f"{q['layers_quantized']} layers", flush=True)
    models = {"fp32": fp32, "int8": res.path}
    if a.both_attention:
        kw["quantize_attention"] = not q["quantize_attention"]
        res2 = calibrate(fp32, d / "calibration", d / "model.int8-other.onnx", num_images=a.calib_images,
                         batch_size=min(16, a.calib_images), **kw)
        models["int8-att" if kw["quantize_attention"] else "int8-noatt"] = res2.path
    if a.fp16:
        models["fp16"] = convert_fp16(fp32, d / "model.fp16.onnx")
    if a.no_spin:
        import onnxruntime as ort

        from vitdeploy.runners.onnxruntime import session_options

        def no_spin_runner(path: Path):
            so = session_options(a.threads)
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            name = sess.get_inputs()[0].name
            return lambda x: sess.run(None, {name: x})[0]

        runners = {k: no_spin_runner(v) for k, v in models.items()}
    else:
        runners = {k: open_runner(v, threads=a.threads) for k, v in models.items()}
    h, w = p.config.image_size
    x = np.random.default_rng(0).standard_normal((a.batch, 3, h, w)).astype(np.float32)
    for r in runners.values():  # warm-up
        r(x)
        r(x)
    per_round: dict[str, list[float]] = {k: [] for k in runners}
    for i in range(a.rounds):
        order = list(runners) if i % 2 == 0 else list(reversed(runners))
        for k in order:
            t0 = time.perf_counter()
            for _ in range(a.iters):
                runners[k](x)
            per_round[k].append(a.batch * a.iters / (time.perf_counter() - t0))
    from vitdeploy.tools.bench import cpu_flags, cpu_model

    ips = {k: statistics.median(v) for k, v in per_round.items()}
    print(f"{a.preset} at {h}x{w}, batch {a.batch}, ONNX Runtime CPU ({cpu_model()}; {', '.join(cpu_flags())}), "
          f"{a.rounds} interleaved rounds x {a.iters} calls, threads {a.threads or 'one per core'}"
          f"{', no spinning' if a.no_spin else ''}")
    for k, v in ips.items():
        print(f"  {k:5s} {v:8.2f} img/s (median; min {min(per_round[k]):.2f}, max {max(per_round[k]):.2f})")
    ratios = {f"{k}/fp32": ips[k] / ips["fp32"] for k in ips if k != "fp32"}
    for k, v in ratios.items():
        paired = [i8 / f for i8, f in zip(per_round[k.split("/")[0]], per_round["fp32"], strict=True)]
        print(f"  {k} throughput ratio {v:.2f}x (per-round ratios: median {statistics.median(paired):.2f}x, "
              f"range {min(paired):.2f}–{max(paired):.2f}x)")
    if a.json:
        a.json.write_text(json.dumps({"preset": a.preset, "batch": a.batch, "images_per_s": ips, "ratios": ratios,
                                      "per_round": per_round, "quantization": q}, indent=2))


if __name__ == "__main__":
    main()
