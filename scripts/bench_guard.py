#!/usr/bin/env python3
"""How the accuracy guard's graph work grows with the layer count: rebuild per probe (old) vs switch in place (new).

    .venv/bin/python scripts/bench_guard.py                          # vit-digits and vit-small
    .venv/bin/python scripts/bench_guard.py --presets vit-digits vit-base --keep /tmp/bench-guard

Random weights (the graph work does not depend on them): each preset is built with
torch.manual_seed(0), exported with vitdeploy's exporter (no parity check) and its
quantizable layers found as calibrate finds them (attention matmuls left out, the default).
Ranges are a flat 1.0 per tensor: the cost of writing Q/DQ does not depend on them.

A guard that ends up excluding every layer (the worst case) probes 1 + L + L graphs: all
layers, each layer alone (sensitivities), then 1, 2, …, L layers excluded. Both approaches
make exactly that sequence, up to the serialized model ONNX Runtime is given:
  old: insert_qdq(model, kept layers) per probe — a deep copy and every kept weight quantized again;
  new: one SwitchableQDQ (each weight quantized once), select(excluded) per probe, final() once.
Weight quantizations are counted by wrapping the real quantize_weight. ONNX Runtime
inference, the same in both, is not included.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def export_random(preset: str, d: Path) -> Path:
    import torch

    from vitdeploy.core.manifest import Manifest
    from vitdeploy.model.checkpoint import save_checkpoint
    from vitdeploy.model.vit import VisionTransformer, get_preset
    from vitdeploy.stages.export import export_onnx

    out = d / f"{preset}.onnx"
    if out.exists():
        return out
    p = get_preset(preset)
    torch.manual_seed(0)
    model = VisionTransformer(p.config).eval()
    man = Manifest(model=p.config.to_dict(), labels=[f"class_{i}" for i in range(p.config.num_classes)],
                   preprocess=dict(p.preprocess), name=preset)
    save_checkpoint(d / f"{preset}.pth", model, man)
    export_onnx(d / f"{preset}.pth", out, check=False)
    return out


def guard_probes(names: list[str]) -> list[list[str]]:
    """The excluded-layer lists a guard that ends up excluding every layer probes, in its order."""
    return [[], *[[o for o in names if o != n] for n in names], *[names[: k + 1] for k in range(len(names))]]


def measure(path: Path) -> dict[str, Any]:
    import onnx

    import vitdeploy.graph.quantize as q

    model = onnx.load(str(path))
    q.ensure_node_names(model)
    layers = [la for la in q.find_layers(model) if la.kind != "attention"]
    amax = {t: 1.0 for t in q.tensors_to_calibrate(layers)}
    probes = guard_probes([la.node for la in layers])
    count = [0]
    real = q.quantize_weight

    def counted(*a: Any, **k: Any) -> Any:
        count[0] += 1
        return real(*a, **k)

    q.quantize_weight = counted  # type: ignore[assignment]
    try:
        t = time.perf_counter()
        for ex in probes:  # old: build(excluded) = insert_qdq of the kept layers, per probe
            q.insert_qdq(model, [la for la in layers if la.node not in set(ex)], amax).SerializeToString()
        old_s, old_q = time.perf_counter() - t, count[0]
        count[0] = 0
        t = time.perf_counter()
        sw = q.SwitchableQDQ(model, layers, amax)
        for ex in probes:
            sw.select(ex).SerializeToString()
        sw.final(probes[-1])
        new_s, new_q = time.perf_counter() - t, count[0]
    finally:
        q.quantize_weight = real  # type: ignore[assignment]
    return {"layers": len(layers), "probes": len(probes), "mb": path.stat().st_size / 1e6,
            "old_s": old_s, "new_s": new_s, "old_q": old_q, "new_q": new_q}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["vit-digits", "vit-small"])
    ap.add_argument("--keep", type=Path, help="keep the exported models here (reused on the next run)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-guard-") as t:
        d = a.keep or Path(t)
        d.mkdir(parents=True, exist_ok=True)
        rows = [(p, measure(export_random(p, d))) for p in a.presets]
    print(f"{'preset':<12}{'ONNX MB':>8}{'layers L':>9}{'probes':>8}{'old s':>9}{'new s':>9}{'old/new':>9}"
          f"{'quantizations old':>19}{'new':>6}")
    for p, r in rows:
        print(f"{p:<12}{r['mb']:>8.1f}{r['layers']:>9}{r['probes']:>8}{r['old_s']:>9.2f}{r['new_s']:>9.2f}"
              f"{r['old_s'] / r['new_s']:>9.1f}{r['old_q']:>19}{r['new_q']:>6}")
    print("graph work only (building and serializing each probe's model); ONNX Runtime inference, the same in both, not included")


if __name__ == "__main__":
    main()
