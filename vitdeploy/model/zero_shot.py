"""Zero-shot classifiers from class names: an image–text pair's text tower run once, here, folded into a classifier.

``vitdeploy import ./clip --classes labels.txt [--templates openai|simple|FILE]`` reads both towers of a CLIP or
SigLIP pair (a transformers ``CLIPModel`` / ``SiglipModel`` folder with its tokenizer, or an open_clip ``save_for_hf``
folder with open_clip's tokenizer) and writes a plain classifier checkpoint: the image tower (model/hf_import.py,
model/open_clip_import.py) → L2 normalisation → ``head``, a Linear whose weight is exp(logit_scale)·W and whose bias
is SigLIP's logit_bias (0 for CLIP), W the class embeddings. So export, INT8/FP16, verify, bundle, run.py, C++ and
Triton serve it as any classifier, and nothing on the device needs the text tower (Ultralytics' YOLO-World
``set_classes`` then ``export`` is the experience to match).

Why this way:
- The text side is the library's, never a copy: transformers' ``get_text_features`` with the folder's own
  tokenizer (SigLIP's padded to ``max_length`` as it was trained; CLIP's to the longest prompt, its EOS token pooled),
  or open_clip's ``encode_text`` with ``open_clip.get_tokenizer``; templates are open_clip's tables
  (``zero_shot_metadata``) or the user's file. They run once, on the host, in float32.
- Prompts are ensembled as open_clip's ``build_zero_shot_classifier`` does: per class, the mean of the L2-normalised
  text embeddings of its prompts, normalised again (classes in batches of 10, as it batches them).
- The manifest's task (core/task.py) keeps the templates, the SHA-256 of the float32 class-embedding matrix W
  ([classes, dim], C order, before the scale), the logit scale and bias: what made the head can be checked later.
- torch, transformers and open_clip are imported here, lazily (the checks of the class names, a template file and the
  folder need none of them, so a bad input is refused before torch is loaded); the CPU install stays light:
  transformers, open_clip, tokenizers and sentencepiece come with ``pip install 'vitdeploy[foundation]'``, and a
  missing one is named in one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.schema import Fields, load_json
from vitdeploy.core.task import CLASSIFIER, Task
from vitdeploy.core.text import label_problem, printable
from vitdeploy.model.sources import HF_CONFIG, OPEN_CLIP_CONFIG, is_hf_folder, is_open_clip_folder

if TYPE_CHECKING:  # torch, the checkpoint and the ViT only where the work starts: a bad class list needs none of them
    import torch

    from vitdeploy.model.checkpoint import Checkpoint

INSTALL = "pip install 'vitdeploy[foundation]'"
# --templates NAME: open_clip.zero_shot_metadata's tables
TEMPLATE_TABLES = {"openai": "OPENAI_IMAGENET_TEMPLATES", "simple": "SIMPLE_IMAGENET_TEMPLATES"}
DEFAULT_TEMPLATES = "openai"
CLASSES_PER_BATCH = 10  # open_clip's build_zero_shot_classifier(num_classes_per_batch=10)
# transformers pairs: how each pads its prompts (SigLIP was trained on max_length padding and pools the last token)
HF_PAIRS = {"clip": True, "siglip": "max_length"}
# A tokenizer saved beside a transformers model (tokenizer.json: fast; vocab.json + merges.txt: CLIP's BPE;
# spiece.model: SigLIP's sentencepiece)
_TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("spiece.model",), ("sentencepiece.bpe.model",),
                    ("tokenizer.model",))


def _tokenizer_files(folder: Path) -> str | None:
    for files in _TOKENIZER_FILES:
        if all((folder / f).is_file() for f in files):
            return " + ".join(files)
    return None


# --- class names and templates (checked before any weights are read) -----------------------------------------


def _lines(path: Path, option: str) -> list[str]:
    """The file's lines, split at '\\n' only (a CRLF's '\\r' dropped), so a name holding another line break is
    seen and refused rather than silently split; trailing blank lines ignored. A regular file of a bounded size
    (core/limits.py ``text_file_bytes``): a FIFO or /dev/zero is refused in one line before it is read."""
    from vitdeploy.core.fileio import NotAFileOfBoundedSize, read_bounded
    from vitdeploy.core.limits import bounds

    try:
        text = read_bounded(path, int(bounds("text_file_bytes")["max"])).decode("utf-8-sig")  # -sig: a BOM (Notepad)
    except FileNotFoundError:
        raise UsageError(f"{option} {path}: no such file") from None
    except NotAFileOfBoundedSize as e:
        raise UsageError(f"{option} {path}: {e}; give a text file, one entry per line") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{option} {path}: cannot read it as UTF-8 text ({type(e).__name__})") from None
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    while lines and not lines[-1].strip(" \t"):
        lines.pop()
    return lines


def read_class_names(path: str | Path) -> list[str]:
    """The class names of ``--classes``, one per line (spaces and tabs around a name dropped). Refused, in one line
    naming the line: an empty list, a blank line, a duplicate, a name labels.txt cannot hold as one line."""
    p = Path(path)
    names = [ln.strip(" \t") for ln in _lines(p, "--classes")]
    if not names:
        raise UsageError(f"--classes {p}: no class names; write one class name per line")
    seen: dict[str, int] = {}
    for i, n in enumerate(names, 1):
        if not n:
            raise UsageError(f"--classes {p}: line {i} is blank; write one class name per line")
        bad = label_problem(n)
        if bad:
            raise UsageError(f"--classes {p}: line {i} '{printable(n)}' {bad}; a class name is one plain line of "
                             "labels.txt: rename it")
        if n in seen:
            raise UsageError(f"--classes {p}: '{printable(n)}' is on lines {seen[n]} and {i}; name each class once")
        seen[n] = i
    return names


def _check_template(t: str, where: str) -> str:
    if "{}" not in t:
        raise UsageError(f"{where} '{printable(t)}' has no {{}} where the class name goes; write e.g. 'a photo of a {{}}.'")
    try:
        t.format("x")
    except (IndexError, KeyError, ValueError):
        raise UsageError(f"{where} '{printable(t)}': other braces than one {{}} (double them, {{{{ }}}}, to keep them)") from None
    return t


def read_templates(spec: str | Path = DEFAULT_TEMPLATES) -> list[str]:
    """``--templates``: ``openai`` or ``simple`` (open_clip.zero_shot_metadata's tables, each template read as the
    text it makes of ``{}``), or a file of templates, one per line, each holding ``{}`` where the class name goes."""
    name = str(spec)
    if name in TEMPLATE_TABLES:
        try:
            import open_clip.zero_shot_metadata as meta
        except ImportError:
            raise VitdeployError(f"--templates {name} reads open_clip's template table, and open_clip is not "
                                 f"installed: {INSTALL} (or pass a file of templates)") from None
        table = getattr(meta, TEMPLATE_TABLES[name])
        return [_check_template(t("{}") if callable(t) else str(t), f"open_clip's {name} template") for t in table]
    p = Path(spec)
    lines = _lines(p, "--templates")
    if not lines:
        raise UsageError(f"--templates {p}: empty; write one template per line, e.g. 'a photo of a {{}}.' "
                         f"(or name a table: {', '.join(TEMPLATE_TABLES)})")
    out = []
    for i, t in enumerate(lines, 1):
        bad = label_problem(t)
        if bad:
            raise UsageError(f"--templates {p}: line {i} {bad}")
        out.append(_check_template(t.strip(" \t"), f"--templates {p}: line {i}"))
    return out


# --- text towers ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' loading reports (unused weights, progress bars) kept off the user's terminal."""
    import transformers

    lg = transformers.utils.logging
    level = lg.get_verbosity()
    lg.set_verbosity_error()
    lg.disable_progress_bar()
    try:
        yield
    finally:
        lg.set_verbosity(level)
        lg.enable_progress_bar()


class TextTower:
    """The text side of a pair: ``encode(prompts)`` (the library's text features, not normalised), the logit scale
    (exp(logit_scale)) and bias, and the name of the source ("clip", "siglip", "open_clip")."""

    source: str
    logit_scale: float
    logit_bias: float

    def encode(self, prompts: list[str]) -> torch.Tensor:
        raise NotImplementedError


class HFTextTower(TextTower):
    """transformers' ``get_text_features`` and the folder's own tokenizer (``AutoTokenizer``), float32, no hub."""

    def __init__(self, folder: Path, model_type: str) -> None:
        try:
            import transformers
        except ImportError:
            raise VitdeployError(f"--classes on a transformers {model_type} folder runs its text tower with "
                                 f"transformers, which is not installed: {INSTALL}") from None
        if model_type == "siglip" and importlib.util.find_spec("sentencepiece") is None:
            raise VitdeployError(f"--classes on a SigLIP folder reads its sentencepiece tokenizer, and sentencepiece "
                                 f"is not installed: {INSTALL}")
        with _quiet_transformers():
            try:
                model, info = transformers.AutoModel.from_pretrained(folder, local_files_only=True,
                                                                     output_loading_info=True)
                self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
            except (OSError, ValueError, ImportError) as e:
                raise VitdeployError(f"{folder}: transformers cannot load the pair ({_first_line(e)})") from None
        missing = [k for k in info.get("missing_keys", ()) if not k.startswith("vision_model.")]
        if missing:
            raise UsageError(f"{folder}: the weights lack the text tower ({', '.join(sorted(missing)[:3])}); --classes "
                             "needs both towers: save the whole pair (model.save_pretrained)")
        self.model = model.float().eval()
        self.source = model_type
        self.logit_scale = float(self.model.logit_scale.detach().float().exp())
        bias = getattr(self.model, "logit_bias", None)
        self.logit_bias = float(bias.detach().float().reshape(-1)[0]) if bias is not None else 0.0
        self.kwargs: dict[str, Any] = {"padding": HF_PAIRS[model_type], "truncation": True,
                                       "max_length": int(self.model.config.text_config.max_position_embeddings)}

    def encode(self, prompts: list[str]) -> torch.Tensor:
        import torch

        enc = self.tokenizer(prompts, return_tensors="pt", **self.kwargs)
        out = self.model.get_text_features(**{k: enc[k] for k in ("input_ids", "attention_mask") if k in enc})
        return out if isinstance(out, torch.Tensor) else out.pooler_output  # transformers 5: a BaseModelOutputWithPooling


class OpenClipTextTower(TextTower):
    """open_clip's ``encode_text`` and ``get_tokenizer``, both from the folder (``local-dir:``), float32."""

    def __init__(self, folder: Path) -> None:
        try:
            import open_clip
        except ImportError:
            raise VitdeployError(f"--classes on an open_clip checkpoint runs its text tower with open_clip, which is "
                                 f"not installed: {INSTALL}") from None
        where = f"local-dir:{folder}"
        try:
            model = open_clip.create_model(where, precision="fp32", device="cpu")
            self.tokenizer = open_clip.get_tokenizer(where)
        except ImportError as e:
            raise VitdeployError(f"{folder}: open_clip needs {_first_line(e)}: {INSTALL}") from None
        except Exception as e:  # noqa: BLE001 - open_clip raises RuntimeError/ValueError/KeyError on what it cannot build
            text = [k for k in re.findall(r'"([^"]+)"', str(e)) if not k.startswith("visual.")]
            if "Missing key" in str(e) and text:  # load_state_dict(strict=True): the weights lack the text tower
                raise UsageError(f"{folder}: the weights lack the text tower ({', '.join(text[:3])}); --classes needs "
                                 "both towers: save the whole model with save_for_hf") from None
            raise VitdeployError(f"{folder}: open_clip cannot load the model ({_first_line(e)})") from None
        self.model = model.eval()
        self.source = "open_clip"
        self.logit_scale = float(self.model.logit_scale.detach().float().exp())
        bias = getattr(self.model, "logit_bias", None)
        self.logit_bias = float(bias.detach().float().reshape(-1)[0]) if bias is not None else 0.0

    def encode(self, prompts: list[str]) -> torch.Tensor:
        return self.model.encode_text(self.tokenizer(prompts))


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return (s.splitlines()[0][:160] if s else type(e).__name__)


def open_pair(source: str | Path) -> tuple[Path, str]:
    """The folder of an image–text pair and its kind ("huggingface" | "open_clip"), or one line (exit 2) naming what
    is missing: no text tower, no tokenizer. Reads config files only."""
    p = Path(source)
    if p.is_file() and p.name in (HF_CONFIG, OPEN_CLIP_CONFIG):
        p = p.parent
    pair = ("--classes needs an image-text pair: a transformers CLIPModel or SiglipModel folder with its tokenizer, "
            "or an open_clip checkpoint (open_clip_config.json)")
    if is_open_clip_folder(p):
        f = p / OPEN_CLIP_CONFIG
        model_cfg = Fields(f, load_json(f)).raw("model_cfg") or {}
        if not isinstance(model_cfg, dict):
            raise Fields(f, {}).refuse("model_cfg", model_cfg, "an object {...} (open_clip's model config)")
        text_cfg = model_cfg.get("text_cfg")
        if not isinstance(text_cfg, dict):
            raise UsageError(f"{f}: no text tower (model_cfg.text_cfg); {pair}")
        if text_cfg.get("hf_tokenizer_name") and _tokenizer_files(p) is None:
            raise UsageError(f"{p}: no tokenizer (its text_cfg names hf_tokenizer_name {text_cfg['hf_tokenizer_name']!r}, "
                             "and no tokenizer.json or vocabulary is in the folder); save it there with "
                             "save_for_hf(model, tokenizer, ...)")
        return p, "open_clip"
    if is_hf_folder(p):
        f = p / HF_CONFIG
        cfg = Fields(f, load_json(f)).obj
        what = ", ".join(cfg.get("architectures") or []) or cfg.get("architecture") or cfg.get("model_type") or "a model"
        if not isinstance(cfg.get("text_config"), dict):
            raise UsageError(f"{p}: {what} has no text tower (text_config); {pair}")
        mtype = str(cfg.get("model_type"))
        if mtype not in HF_PAIRS:
            raise UsageError(f"{p}: model_type {mtype!r}; vitdeploy makes zero-shot classifiers from "
                             f"{' and '.join(HF_PAIRS)} pairs and open_clip checkpoints")
        if _tokenizer_files(p) is None:
            raise UsageError(f"{p}: no tokenizer (tokenizer.json, vocab.json + merges.txt, or spiece.model); save the "
                             "processor beside the model: processor.save_pretrained(folder)")
        return p, "huggingface"
    if p.is_dir():
        raise UsageError(f"{p}: neither config.json nor {OPEN_CLIP_CONFIG}; {pair}")
    raise UsageError(f"{p}: a weights file has no text tower or tokenizer; {pair}")


def text_tower(folder: Path, kind: str) -> TextTower:
    if kind == "open_clip":
        return OpenClipTextTower(folder)
    mtype = str(Fields(folder / HF_CONFIG, load_json(folder / HF_CONFIG)).obj.get("model_type"))
    return HFTextTower(folder, mtype)


# --- the classifier --------------------------------------------------------------------------------------------


def class_embeddings(tower: TextTower, classes: Sequence[str], templates: Sequence[str],
                     progress: Callable[[int, int], None] | None = None) -> torch.Tensor:
    """W [classes, dim], float32: per class, the mean of the L2-normalised text features of its prompts, normalised
    again (open_clip's build_zero_shot_classifier), ``CLASSES_PER_BATCH`` classes a forward."""
    import torch
    import torch.nn.functional as F

    rows = []
    with torch.no_grad():
        for start in range(0, len(classes), CLASSES_PER_BATCH):
            batch = classes[start:start + CLASSES_PER_BATCH]
            prompts = [t.format(c) for c in batch for t in templates]
            emb = F.normalize(tower.encode(prompts).float(), dim=-1)
            emb = emb.reshape(len(batch), len(templates), -1).mean(dim=1)
            rows.append(F.normalize(emb, dim=-1))
            if progress:
                progress(start + len(batch), len(classes))
    w = torch.cat(rows)
    if not torch.isfinite(w).all():
        raise VitdeployError("the text tower answered NaN or Inf for some prompts; the class embeddings are unusable")
    return w.contiguous()


def text_sha256(w: torch.Tensor) -> str:
    """The SHA-256 of the class-embedding matrix's float32 bytes (C order, [classes, dim])."""
    return hashlib.sha256(w.detach().float().contiguous().numpy().tobytes()).hexdigest()


def fold_classifier(image: Checkpoint, w: torch.Tensor, logit_scale: float, logit_bias: float, classes: list[str],
                    zero_shot: dict[str, Any]) -> Checkpoint:
    """The image tower (an embedding model) → L2 normalisation → Linear(exp(logit_scale)·W, logit_bias): a classifier
    checkpoint whose manifest's task says how it was made."""
    import torch

    from vitdeploy.model.checkpoint import Checkpoint
    from vitdeploy.model.vit import ViTConfig

    cfg = ViTConfig.from_dict(image.manifest.model)
    if cfg.num_classes:
        raise VitdeployError("the image tower has a classifier head already; a zero-shot head needs the bare tower")
    if int(w.shape[1]) != cfg.feature_dim:
        raise VitdeployError(f"the text features are {int(w.shape[1])}-d but the image features {cfg.feature_dim}-d: "
                             "the two towers do not share an embedding space")
    if not (math.isfinite(logit_scale) and math.isfinite(logit_bias)):
        raise VitdeployError(f"logit scale {logit_scale} / bias {logit_bias}: not finite numbers")
    new = cfg.with_(num_classes=len(classes), l2_norm=True)
    state = dict(image.state_dict)
    state["head.weight"] = (w * torch.tensor(logit_scale, dtype=torch.float32)).contiguous()
    state["head.bias"] = torch.full((len(classes),), logit_bias, dtype=torch.float32)
    task = Task(CLASSIFIER, len(classes), zero_shot=zero_shot)
    m = image.manifest.derive(model=new.to_dict(), labels=list(classes))
    m.extra["task"] = task.to_dict()
    return Checkpoint(m, state)


@dataclass(frozen=True)
class ZeroShotRequest:
    """``import --classes FILE [--templates openai|simple|FILE]``."""

    classes: Path
    templates: str = DEFAULT_TEMPLATES


@dataclass(frozen=True)
class ZeroShotPlan:
    """A request checked against its source, before any weights are read: the pair's folder and kind, the class
    names and the templates."""

    folder: Path
    kind: str
    classes: list[str]
    templates: list[str]


def check_zero_shot(source: str | Path, request: ZeroShotRequest) -> tuple[Path, str, list[str], list[str] | None]:
    """The light checks, in the order a user reads them: the class names, a template file, the folder (a text
    tower, a tokenizer); each refusal one line (exit 2), made without torch or any weights. The folder, its kind, the
    class names and the file's templates (None for a named table, which open_clip holds)."""
    classes = read_class_names(request.classes)
    templates = None if request.templates in TEMPLATE_TABLES else read_templates(request.templates)
    folder, kind = open_pair(source)
    return folder, kind, classes, templates


def plan_zero_shot(source: str | Path, request: ZeroShotRequest) -> ZeroShotPlan:
    """check_zero_shot, then the named template table (open_clip's): before any weights are read."""
    folder, kind, classes, templates = check_zero_shot(source, request)
    return ZeroShotPlan(folder, kind, classes, templates if templates is not None else read_templates(request.templates))


def zero_shot_classifier(image: Checkpoint, plan: ZeroShotPlan,
                         progress: Callable[[int, int], None] | None = None) -> Checkpoint:
    """The classifier of ``plan``'s classes on ``image``, the pair's image tower as an embedding model (load_any of
    the folder): the text tower run once (float32, on this host) and folded into the head."""
    tower = text_tower(plan.folder, plan.kind)
    w = class_embeddings(tower, plan.classes, plan.templates, progress)
    zs = {
        "templates": plan.templates,
        "text_sha256": text_sha256(w),
        "source": tower.source,
        "logit_scale": tower.logit_scale,
        "logit_bias": tower.logit_bias,
    }
    return fold_classifier(image, w, tower.logit_scale, tower.logit_bias, plan.classes, zs)
