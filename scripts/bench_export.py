#!/usr/bin/env python
"""Time `export_onnx` per preset at 224 and print the ratio to the 60 s target (vit-base on 2 CPU cores).

    .venv/bin/python scripts/bench_export.py vit-base            # export + parity (random inputs)
    .venv/bin/python scripts/bench_export.py vit-large vit-huge --no-check

Checkpoints are randomly initialised (the weights do not change the graph or the time);
building them is not timed. Prints the wall time of each step, the process CPU time and
the machine's load average, since other work on a shared machine slows every step.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 60.0


def make_ckpt(path: Path, preset: str, num_classes: int) -> Path:
    import torch

    from vitdeploy.core.manifest import Manifest
    from vitdeploy.model.checkpoint import save_checkpoint
    from vitdeploy.model.vit import VisionTransformer, get_preset

    p = get_preset(preset)
    cfg = p.config.with_(image_size=(224, 224), num_classes=num_classes)
    pp = dict(p.preprocess)
    pp["input_size"] = [224, 224]
    torch.manual_seed(0)
    model = VisionTransformer(cfg).eval()
    man = Manifest(model=cfg.to_dict(), labels=[f"class{i}" for i in range(num_classes)], preprocess=pp, name=preset)
    return save_checkpoint(path, model, man)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("presets", nargs="*", default=["vit-base"])
    ap.add_argument("--no-check", action="store_true", help="skip the parity check")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2: the 2-core target)")
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temporary one)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from vitdeploy.stages.export import export_onnx

    work = args.dir or Path(tempfile.mkdtemp(prefix="bench_export."))
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # no calibration/ here: parity runs on random inputs
    for preset in args.presets:
        ck = make_ckpt(work / f"{preset}.pth", preset, args.classes)
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        r = export_onnx(ck, work / f"{preset}.onnx", check=not args.no_check)
        wall = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        size = r.path.stat().st_size + (r.external_data.stat().st_size if r.external_data else 0)
        steps = ", ".join(f"{k} {v:.1f}" for k, v in r.timings.items())
        print(
            f"{preset}: export {wall:.1f} s wall, {cpu:.1f} s CPU ({steps}); {size / 1e6:.0f} MB"
            f"{' with external data' if r.external_data else ''}; {sum(r.node_counts.values())} nodes; "
            f"load avg {load0:.1f} → {os.getloadavg()[0]:.1f}; peak RSS {cpu1.ru_maxrss / 1e6:.1f} GB"
        )
        if r.parity is not None:
            print(f"  {r.parity.summary()}")
        if preset == "vit-base":
            print(f"  vit-base: {wall:.1f} s / {TARGET_S:.0f} s target = {wall / TARGET_S:.2f}× the budget "
                  f"({'met' if wall <= TARGET_S else 'NOT met'})")
        r.path.unlink()
        if r.external_data:
            r.external_data.unlink()
        ck.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
