"""Small CLIP / SigLIP image–text pairs and vision towers, made offline with the real libraries (not a test module).

Each is built with random weights from its library's config (2 layers, width 64, 32x32 images, patch 8), every
parameter moved well away from its init (so a mapping mistake shows), and saved the way its users save it:
- transformers ``CLIPModel`` with a ``CLIPProcessor``: CLIP's BPE is the one open_clip's wheel carries
  (``open_clip.tokenizer._tokenizer``), written as vocab.json + merges.txt with the special tokens renamed to
  transformers' spelling, read by ``CLIPTokenizer``;
- transformers ``SiglipModel`` with a ``SiglipProcessor``: a sentencepiece model trained in a second on prompts made
  from open_clip's templates and class names, read by ``SiglipTokenizer``;
- an open_clip model of a small registered config (``add_model_config``), saved by ``save_for_hf`` with an
  ``HFTokenizer`` (its text_cfg names no hf_tokenizer_name, so open_clip reads it back with the wheel's tokenizer);
- transformers ``CLIPVisionModelWithProjection`` and ``SiglipVisionModel`` with their image processors.
Nothing here copies a forward pass, a tokenizer or a template table: all of it is the libraries' own.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any

import torch

SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}
VISION = {**SMALL, "image_size": 32, "patch_size": 8}
LOGIT_SCALE = 10.0  # exp(logit_scale): logits well away from 0, so a relative comparison means something
SIGLIP_BIAS = -2.5
SIGLIP_TEXT_LEN = 32  # the text model's max_position_embeddings: what SigLIP's max_length padding pads to
OPEN_CLIP_NAME = "vd-tiny-clip"
OPEN_CLIP_CFG: dict[str, Any] = {
    "embed_dim": 24,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "head_width": 32, "patch_size": 8, "ls_init_value": 0.5},
    "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Every parameter away from its init: norms' gains near 1, position embeddings large, the rest 0.1·N(0, 1);
    the logit scale exp(·) = LOGIT_SCALE, SigLIP's bias SIGLIP_BIAS."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            leaf = name.rsplit(".", 2)
            if name.endswith("logit_scale"):
                p.fill_(math.log(LOGIT_SCALE))
            elif name.endswith("logit_bias"):
                p.fill_(SIGLIP_BIAS)
            elif name.endswith(".weight") and ("norm" in name or leaf[-2].startswith("ln_")):
                p.copy_(1.0 + 0.2 * r)
            elif "position" in name:
                p.copy_(0.5 * r)
            else:
                p.copy_(0.1 * r)


def clip_bpe_tokenizer(folder: Path) -> Any:
    """transformers' CLIPTokenizer over the BPE open_clip's wheel carries."""
    import transformers as T
    from open_clip.tokenizer import _tokenizer as tk

    folder.mkdir(parents=True, exist_ok=True)
    rename = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}
    (folder / "vocab.json").write_text(json.dumps({rename.get(k, k): v for k, v in tk.encoder.items()}))
    merges = sorted(tk.bpe_ranks, key=tk.bpe_ranks.get)
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    return T.CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))


def siglip_tokenizer(folder: Path) -> Any:
    """transformers' SiglipTokenizer over a sentencepiece model trained here on open_clip's prompts."""
    import sentencepiece as spm
    import transformers as T
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES

    folder.mkdir(parents=True, exist_ok=True)
    corpus = [t(c) for t in OPENAI_IMAGENET_TEMPLATES for c in IMAGENET_CLASSNAMES[::20]]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_prefix=str(folder / "spiece"), vocab_size=400,
                                   hard_vocab_limit=False, minloglevel=2)
    return T.SiglipTokenizer(str(folder / "spiece.model"), model_max_length=SIGLIP_TEXT_LEN)


def hf_clip(root: Path, tokenizer: Any) -> Path:
    import transformers as T

    d = root / "hf_clip"
    cfg = T.CLIPConfig(vision_config=VISION, text_config={**SMALL, "vocab_size": 49408, "max_position_embeddings": 32},
                       projection_dim=24)
    model = T.CLIPModel(cfg).eval()
    perturb(model, 1)
    model.save_pretrained(d)
    proc = T.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    T.CLIPProcessor(image_processor=proc, tokenizer=tokenizer).save_pretrained(d)
    return d


def hf_siglip(root: Path, tokenizer: Any) -> Path:
    import transformers as T

    d = root / "hf_siglip"
    cfg = T.SiglipConfig(vision_config=VISION, text_config={**SMALL, "vocab_size": tokenizer.vocab_size,
                                                            "max_position_embeddings": SIGLIP_TEXT_LEN, "projection_size": 64})
    model = T.SiglipModel(cfg).eval()
    perturb(model, 2)
    model.save_pretrained(d)
    proc = T.SiglipImageProcessor(size={"height": 32, "width": 32}, resample=3)
    T.SiglipProcessor(image_processor=proc, tokenizer=tokenizer).save_pretrained(d)
    return d


def open_clip_pair(root: Path, hf_tokenizer_dir: Path) -> Path:
    """open_clip's CLIP of OPEN_CLIP_CFG, saved by save_for_hf (which saves a tokenizer: an HFTokenizer over the
    CLIP tokenizer saved in ``hf_tokenizer_dir``)."""
    import open_clip

    cfgs = root / "open_clip_configs"
    cfgs.mkdir(parents=True, exist_ok=True)
    (cfgs / f"{OPEN_CLIP_NAME}.json").write_text(json.dumps(OPEN_CLIP_CFG))
    open_clip.add_model_config(cfgs)
    model = open_clip.create_model(OPEN_CLIP_NAME, pretrained=None).eval()
    perturb(model, 3)
    d = root / "open_clip"
    tok = open_clip.tokenizer.HFTokenizer(str(hf_tokenizer_dir), context_length=OPEN_CLIP_CFG["text_cfg"]["context_length"])
    importlib.import_module("open_clip.push_to_hf_hub").save_for_hf(model, tok, json.loads(json.dumps(OPEN_CLIP_CFG)), d)
    return d


def vision_towers(root: Path) -> dict[str, Path]:
    """transformers' CLIPVisionModelWithProjection and SiglipVisionModel, each with its image processor."""
    import transformers as T

    out = {}
    made = {
        "clip_vision": (T.CLIPVisionModelWithProjection(T.CLIPVisionConfig(**VISION, projection_dim=24)),
                        T.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})),
        "siglip_vision": (T.SiglipVisionModel(T.SiglipVisionConfig(**VISION)),
                          T.SiglipImageProcessor(size={"height": 32, "width": 32}, resample=3)),
    }
    for i, (name, (model, proc)) in enumerate(made.items()):
        perturb(model.eval(), 10 + i)
        model.save_pretrained(root / name)
        proc.save_pretrained(root / name)
        out[name] = root / name
    return out
