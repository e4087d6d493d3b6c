#!/usr/bin/env python
"""Does decoding keep up? `infer` over 1,000 JPEG photos (640x480) vs what `benchmark` reports for the same model and batch.

    .venv/bin/python scripts/bench_infer.py [--preset vit-small] [--model M.onnx] [--images N] [--batch-size 8]

Writes the photos (random crops and resizes of scikit-image's sample photographs, JPEG
quality 90) into --folder, makes a random-weight INT8 ONNX of the preset unless --model is
given, then measures in one process: benchmark, infer over the folder, benchmark again.
The ratio is infer's images/s over the mean of the two benchmark figures. Target: >= 0.90.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

SOURCES = ("astronaut", "coffee", "chelsea", "rocket", "camera", "hubble_deep_field", "immunohistochemistry", "motorcycle_left")


def write_photos(folder: Path, n: int, size: tuple[int, int] = (640, 480), seed: int = 0) -> list[Path]:
    """n JPEGs of exactly ``size`` (w, h): random crops of real photographs, resized, sometimes mirrored."""
    from skimage import data

    folder.mkdir(parents=True, exist_ok=True)
    existing = sorted(folder.glob("photo_*.jpg"))
    if len(existing) >= n:
        return existing[:n]
    photos = []
    for name in SOURCES:
        try:
            photos.append(Image.fromarray(np.asarray(getattr(data, name)())).convert("RGB"))
        except Exception:  # noqa: BLE001 - a sample that needs a download (pooch) is left out
            continue
    rng = np.random.default_rng(seed)
    w, h = size
    out = []
    for i in range(n):
        src = photos[i % len(photos)]
        sw, sh = src.size
        cw = int(rng.integers(sw // 2, sw + 1))
        ch = min(sh, max(sh // 2, int(cw * h / w * rng.uniform(0.8, 1.25))))
        x0, y0 = int(rng.integers(0, sw - cw + 1)), int(rng.integers(0, sh - ch + 1))
        im = src.crop((x0, y0, x0 + cw, y0 + ch)).resize((w, h), Image.Resampling.BILINEAR)
        if rng.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        p = folder / f"photo_{i:05d}.jpg"
        im.save(p, quality=90)
        out.append(p)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="vit-small")
    ap.add_argument("--model", type=Path, help="an existing artifact to measure instead of a random-weight INT8 ONNX")
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0, help="benchmark seconds (each of the two runs)")
    ap.add_argument("--workers", type=int, default=None, help="reader threads (default: images.default_workers())")
    ap.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()) / "vitdeploy-photos-640x480")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    from vitdeploy.runners import open_runner
    from vitdeploy.tools.bench import benchmark, library_versions, machine_info, preset_artifacts
    from vitdeploy.tools.infer import infer

    t = time.perf_counter()
    photos = write_photos(args.folder, args.images)
    print(f"{len(photos)} photos 640x480 in {args.folder} ({time.perf_counter() - t:.0f} s)", flush=True)
    tmp = tempfile.TemporaryDirectory(prefix="vitdeploy-bench-infer-")
    model = args.model
    if model is None:
        arts, notes = preset_artifacts(args.preset, Path(tmp.name), progress=lambda s: print(s, flush=True))
        int8 = [p for p in arts if p.name == "model.int8.onnx"]
        if not int8:
            print("no INT8 ONNX could be made: " + "; ".join(notes), file=sys.stderr)
            return 1
        model = int8[0]
    b = args.batch_size
    with open_runner(model) as runner:
        print(f"model {model} ({runner.backend}, {runner.precision}), batch {b}", flush=True)
        bench1 = benchmark([model], [b], seconds=args.seconds).results[0].throughput
        print(f"benchmark: {bench1:.2f} images/s", flush=True)
        # CPU time per image (all threads of this process): unlike wall time, barely moved by other jobs' load
        x = np.random.default_rng(0).standard_normal((b, 3, *runner.manifest.input_size), dtype=np.float32)
        runner(x)
        c0, n_calls = time.process_time(), max(3, int(40 / b))
        for _ in range(n_calls):
            runner(x)
        model_cpu = (time.process_time() - c0) / (n_calls * b)
        c0 = time.process_time()
        res = infer([args.folder], batch_size=b, top_k=5, runner=runner, workers=args.workers)
        infer_cpu = (time.process_time() - c0) / max(1, len(res.predictions))
        print(f"infer: {len(res.predictions)} images in {res.seconds:.1f} s = {res.images_per_second:.2f} images/s"
              f" ({len(res.skipped)} skipped)", flush=True)
        bench2 = benchmark([model], [b], seconds=args.seconds).results[0].throughput
        print(f"benchmark again: {bench2:.2f} images/s", flush=True)
    ratio = res.images_per_second / ((bench1 + bench2) / 2)
    print(f"CPU per image: model alone {model_cpu * 1000:.1f} ms, infer (decode + model) {infer_cpu * 1000:.1f} ms; "
          f"ratio on an otherwise idle machine, if CPU-bound: ~{model_cpu / infer_cpu:.3f}")
    print(f"infer / benchmark = {ratio:.3f}  (target >= 0.90: {'reached' if ratio >= 0.9 else 'NOT reached'})")
    if args.json:
        args.json.write_text(json.dumps({
            "model": str(model), "batch": b, "images": len(res.predictions), "infer_images_per_s": res.images_per_second,
            "benchmark_images_per_s": [bench1, bench2], "ratio": ratio,
            "cpu_ms_per_image": {"model": model_cpu * 1000, "infer": infer_cpu * 1000}, "machine": machine_info(),
            "versions": library_versions(),
        }, indent=2) + "\n")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
