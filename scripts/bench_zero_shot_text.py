"""prompts/s of a zero-shot import's text side (model/zero_shot.py ``class_embeddings``) on the small CLIP, SigLIP and
open_clip pairs the tests build offline (tests/foundation_pairs.py): every prompt checked uncut, encoded in batches of
about 1,024, and the classes compared. Prints, per pair, prompts/s and the share spent tokenising uncut (the check
pass, issue 40 C), and the largest cosine between two classes' vectors (the import refuses two above 0.9999). A
speed figure lives here, not in a timed test.

The tests' random towers do not separate thousands of classes (their position embeddings and the end-of-text token
outweigh the words, so every prompt's pooled vector is nearly the same: a largest cosine of 0.99994 over 1,500
classes), which a trained tower does. ``--separating`` also makes ``hf_clip_separating`` (separating_clip below), a
CLIPModel whose pooled vector is carried by the prompt's words, for an import of 10,000 classes x 80 templates:

    python scripts/bench_zero_shot_text.py [--classes 100] [--pairs DIR] [--separating]
    python -m vitdeploy import DIR/hf_clip_separating --classes classes.txt -o clip10k.pth
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

SEPARATING = "hf_clip_separating"


def separating_clip(root: Path, tokenizer_dir: Path) -> Path:
    """A transformers CLIPModel saved with save_pretrained and the real CLIP BPE (as tests/foundation_pairs.hf_clip),
    whose text tower separates its classes as a trained one does: its token embeddings N(0, 1), the end-of-text
    token's embedding 0 and the position embeddings 0.01·N(0, 1) (perturb's are 0.5·N(0, 1) against tokens of
    0.1·N(0, 1)). The pooled vector is read at the end-of-text token, so its residual is what attention mixes in from
    the prompt's words, not a constant every prompt shares; the projection is 64-d (24 in the tests' pair). Measured
    on 10,000 names (ImageNet's, then each with a number: 'drum 11') x open_clip's 80 templates: largest cosine
    between two classes 0.995013 ('drum 11', 'lipstick 11'), against 0.99994 over 1,500 of them for the tests'
    hf_clip."""
    import foundation_pairs as fp
    import torch
    import transformers as T

    d = root / SEPARATING
    cfg = T.CLIPConfig(vision_config=fp.VISION, projection_dim=64,
                       text_config={**fp.SMALL, "vocab_size": 49408, "max_position_embeddings": 32})
    model = T.CLIPModel(cfg).eval()
    fp.perturb(model, 1)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        emb = model.text_model.embeddings
        emb.token_embedding.weight.copy_(torch.randn(emb.token_embedding.weight.shape, generator=g))
        emb.token_embedding.weight[cfg.text_config.eos_token_id] = 0.0
        emb.position_embedding.weight.mul_(0.02)
    model.save_pretrained(d)
    tok = T.CLIPTokenizer(str(tokenizer_dir / "vocab.json"), str(tokenizer_dir / "merges.txt"))
    proc = T.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    T.CLIPProcessor(image_processor=proc, tokenizer=tok).save_pretrained(d)
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", type=int, default=100, help="class names (distinct ImageNet names of <= 12 characters)")
    ap.add_argument("--pairs", type=Path, default=None, help="a folder of pairs made earlier (default: made now)")
    ap.add_argument("--separating", action="store_true", help=f"also make and measure {SEPARATING} (separating_clip)")
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
    if a.separating and not (root / SEPARATING).is_dir():
        if not (root / "clip_bpe" / "vocab.json").is_file():
            fp.clip_bpe_tokenizer(root / "clip_bpe")
        separating_clip(root, root / "clip_bpe")
    names = list(dict.fromkeys(c for c in IMAGENET_CLASSNAMES if len(c) <= 12))
    classes = [names[i % len(names)] + (f" {i // len(names)}" if i >= len(names) else "") for i in range(a.classes)]
    templates = z.read_templates("openai")
    n = len(classes) * len(templates)
    for name in ("hf_clip", "hf_siglip", "open_clip", *([SEPARATING] if a.separating else [])):
        tower = z.text_tower(*z.open_pair(root / name))
        marks: list[tuple[str, float]] = []
        t0 = time.perf_counter()
        try:
            w = z.class_embeddings(tower, classes, templates,
                                   lambda d, t, phase, m=marks: m.append((phase, time.perf_counter())))
        except z.VitdeployError as e:  # two classes it cannot separate: said, and the other pairs still measured
            print(f"{name}: refused: {e}", flush=True)
            continue
        dt = time.perf_counter() - t0
        cos = w @ w.T
        cos.fill_diagonal_(-1.0)
        phases: dict[str, float] = {}
        prev = t0
        for phase, at in marks:
            phases[phase] = phases.get(phase, 0.0) + at - prev
            prev = at
        share = ", ".join(f"{p} {100 * s / dt:.0f}%" for p, s in phases.items())
        print(f"{name}: {len(classes)} classes x {len(templates)} templates = {n} prompts in {dt:.1f} s: "
              f"{n / dt:.0f} prompts/s ({1e3 * dt / n:.3f} ms/prompt; {share}); largest cosine between two classes "
              f"{float(cos.max()):.6f}", flush=True)


if __name__ == "__main__":
    main()
