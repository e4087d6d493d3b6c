"""prompts/s of a zero-shot import's text side (model/zero_shot.py ``class_embeddings``) on the small CLIP, SigLIP and
open_clip pairs the tests build offline (tests/foundation_pairs.py): every prompt checked uncut, encoded in batches of
about 1,024, and the classes compared. Prints, per pair, prompts/s and the share spent tokenising uncut (the check
pass, issue 40 C). A speed figure lives here, not in a timed test.

    python scripts/bench_zero_shot_text.py [--classes 100] [--pairs DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", type=int, default=100, help="class names (distinct ImageNet names of <= 12 characters)")
    ap.add_argument("--pairs", type=Path, default=None, help="a folder of pairs made earlier (default: made now)")
    a = ap.parse_args()
    import foundation_pairs as fp
    import torch
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    from vitdeploy.model import zero_shot as z

    root = a.pairs or Path(tempfile.mkdtemp(prefix="zs-bench-"))
    if not (root / "open_clip").is_dir():
        torch.manual_seed(0)
        clip = fp.hf_clip(root, fp.clip_bpe_tokenizer(root / "clip_bpe"))
        fp.hf_siglip(root, fp.siglip_tokenizer(root / "spm"))
        fp.open_clip_pair(root, clip)
    names = list(dict.fromkeys(c for c in IMAGENET_CLASSNAMES if len(c) <= 12))
    classes = [names[i % len(names)] + (f" {i // len(names)}" if i >= len(names) else "") for i in range(a.classes)]
    templates = z.read_templates("openai")
    n = len(classes) * len(templates)
    for name in ("hf_clip", "hf_siglip", "open_clip"):
        tower = z.text_tower(*z.open_pair(root / name))
        marks: list[tuple[str, float]] = []
        t0 = time.perf_counter()
        z.class_embeddings(tower, classes, templates, lambda d, t, phase, m=marks: m.append((phase, time.perf_counter())))
        dt = time.perf_counter() - t0
        phases: dict[str, float] = {}
        prev = t0
        for phase, at in marks:
            phases[phase] = phases.get(phase, 0.0) + at - prev
            prev = at
        share = ", ".join(f"{p} {100 * s / dt:.0f}%" for p, s in phases.items())
        print(f"{name}: {len(classes)} classes x {len(templates)} templates = {n} prompts in {dt:.1f} s: "
              f"{n / dt:.0f} prompts/s ({1e3 * dt / n:.3f} ms/prompt; {share})", flush=True)


if __name__ == "__main__":
    main()
