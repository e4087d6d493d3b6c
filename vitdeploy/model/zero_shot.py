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
  text embeddings of its prompts, normalised again (in batches of whole classes, about 1024 prompts a forward).
- Text that means what it says (issue 40, C): no prompt is cut (each is tokenised uncut first and one past the
  tower's context is refused, naming the template, the class and the token count); two class names whose vectors
  come out equal are refused, naming both; the tower's sizes are read from its config within core/limits and
  against the weights' before open_clip or transformers allocates; a tokenizer or config the library cannot read is
  named as ``FILE: what is wrong; what to do``.
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

from vitdeploy.core.errors import BadField, UsageError, VitdeployError
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
        bad = label_problem(n) or ("holds \\t (a control character)" if "\t" in n else None)  # docs/commands.md
        if bad:
            raise UsageError(f"--classes {p}: line {i} '{printable(n)}' {bad}; a class name is one plain line of "
                             "labels.txt: rename it")
        if n in seen:
            raise UsageError(f"--classes {p}: '{printable(n)}' is on lines {seen[n]} and {i}; name each class once")
        seen[n] = i
    if len(names) < 2:  # a softmax over one class is 1.000 whatever the image: as train --probe, refuse it
        raise UsageError(f"--classes {p}: only one class ('{printable(names[0])}'); a classifier needs at least two "
                         "class names: add the others it must tell apart")
    return names


def _check_template(t: str, where: str) -> str:
    if "{}" not in t:
        raise UsageError(f"{where} '{printable(t)}' has no {{}} where the class name goes; write e.g. 'a photo of a {{}}.'")
    try:
        t.format("x")
    except (IndexError, KeyError, ValueError):
        raise UsageError(f"{where} '{printable(t)}': other braces than one {{}} (double them, {{{{ }}}}, to keep them)") from None
    return t


def check_templates_spec(spec: str) -> str:
    """``--templates`` as the user typed it: a table name (openai, simple) that is also a file in the current folder
    is refused as ambiguous (the built-in table used to win silently, issue 40 H): ``./openai`` names the file."""
    if spec in TEMPLATE_TABLES and Path(spec).exists():
        raise UsageError(f"--templates {spec}: both open_clip's {spec} table and the file ./{spec} here; write "
                         f"--templates ./{spec} for the file, or run elsewhere (or rename the file) for the table")
    return spec


def read_templates(spec: str | Path = DEFAULT_TEMPLATES) -> list[str]:
    """``--templates``: ``openai`` or ``simple`` (open_clip.zero_shot_metadata's tables, each template read as the
    text it makes of ``{}``), or a file of templates, one per line, each holding ``{}`` where the class name goes."""
    name = str(spec)
    if name in TEMPLATE_TABLES and not isinstance(spec, Path):
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
    """The text side of a pair: ``encode(prompts)`` (the library's text features, not normalised), ``ids(prompts)``
    (the token ids each prompt needs, uncut, so that a prompt past the ``context`` is refused instead of cut), the
    logit scale (exp(logit_scale)) and bias, and the name of the source ("clip", "siglip", "open_clip").
    ``context_field`` names where the context length comes from; ``vocab_rows`` is the embedding table's size (None:
    unknown); ``tokenizer_where`` names the tokenizer's files for a message. ``encodes_ids``: the tower can encode the
    ids ``ids`` gave (``encode_ids``), so class_embeddings tokenises each prompt once, not once to check it and again
    to encode it (a third of the time on a small tower)."""

    source: str
    logit_scale: float
    logit_bias: float
    context: int
    context_field: str
    vocab_rows: int | None = None
    tokenizer_where: str = ""
    encodes_ids: bool = False

    def encode(self, prompts: list[str]) -> torch.Tensor:
        raise NotImplementedError

    def encode_ids(self, ids: list[list[int]]) -> torch.Tensor:
        """The text features of prompts already tokenised by ``ids`` (where ``encodes_ids``): what ``encode`` of
        the same prompts answers."""
        raise NotImplementedError

    def ids(self, prompts: list[str]) -> list[list[int]]:
        raise NotImplementedError


def _weights_name(folder: Path, names: Sequence[str]) -> str:
    return next((n for n in names if (folder / n).exists()), names[0])


def _json_problem(f: Path) -> str | None:
    """Why ``f`` is not JSON (its parser's words), or None."""
    import json

    try:
        if f.stat().st_size > 512 << 20:  # no tokenizer is this large; not parsed just to name the error
            return None
        json.loads(f.read_bytes())
    except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return str(e).splitlines()[0][:100] if str(e) else type(e).__name__
    return None


def tokenizer_error(folder: Path, e: BaseException) -> VitdeployError:
    """``FILE: what is wrong; what to do`` for a tokenizer the library could not read (issue 40, F): the JSON file that
    is not JSON, the sentencepiece model that is not one, else the folder's tokenizer files with the library's words."""
    fix = "save the tokenizer again (processor.save_pretrained(folder)) or copy it from the model's source"
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "special_tokens_map.json", "added_tokens.json"):
        f = folder / name
        bad = _json_problem(f) if f.is_file() else None
        if bad:
            return BadField(f"{f}: not valid JSON ({bad}): the file is cut or damaged; {fix}")
    if importlib.util.find_spec("sentencepiece") is not None:
        for name in ("spiece.model", "sentencepiece.bpe.model", "tokenizer.model"):
            f = folder / name
            if f.is_file():
                import sentencepiece as spm

                try:
                    spm.SentencePieceProcessor(model_file=str(f))
                except Exception as se:  # noqa: BLE001 - sentencepiece raises RuntimeError/OSError on a foreign file
                    return BadField(f"{f}: not a sentencepiece model ({_first_line(se)}); {fix}")
    files = _tokenizer_files(folder) or "its tokenizer files"
    return BadField(f"{folder}/{files}: the tokenizer cannot be read ({type(e).__name__}: {_first_line(e)}); {fix}")


def _finite_scalar(model: Any, name: str, where: str, exp: bool = False) -> float | None:
    """The pair's ``logit_scale`` / ``logit_bias`` as a float (exp(·) for the scale), or None where the model has
    none; a NaN, an infinity or an exp() that overflows is refused naming the file and the tensor."""
    import torch

    t = getattr(model, name, None)
    if t is None:
        return None
    v = t.detach().float().reshape(-1)
    value = float(v[0]) if v.numel() else float("nan")
    out = math.exp(value) if exp and value < 700 else (float("inf") if exp else value)
    if v.numel() != 1 or not bool(torch.isfinite(v).all()) or not math.isfinite(out):
        shown = v[:4].tolist()
        raise BadField(f"{where}: tensor {name} is {shown if v.numel() != 1 else value}, not one finite number"
                       f"{' whose exp() is finite' if exp else ''}; every logit would be NaN or infinite: use the "
                       "pair's original weights")
    return out


def _missing_text(folder: Path, weights: str, missing: list[str], save: str) -> UsageError:
    """Weights that lack tensors the classifier needs: the text tower, or only the logit scale or bias (then say so:
    issue 40 H, a missing logit_bias read as "lacks the text tower")."""
    names = ", ".join(missing[:3])  # in the caller's order (the library's, or sorted)
    if any(not k.startswith(("logit_scale", "logit_bias")) for k in missing):
        return UsageError(f"{folder}: the weights lack the text tower ({names}); --classes needs both towers: {save}")
    return UsageError(f"{folder / weights}: no tensor {names} (the pair's learned logit "
                      f"{' and '.join(k.replace('logit_', '') for k in sorted(missing))}), which the zero-shot logits "
                      f"need; {save}")


# transformers' text-side tensors → the config field that sizes them (a mismatch names the field)
_HF_SIZED_BY = (("position_embedding", "text_config.max_position_embeddings"), ("token_embedding", "text_config.vocab_size"),
                ("text_projection", "projection_dim"), ("text_model.head", "text_config.projection_size"))


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
        from vitdeploy.model.sources import HF_WEIGHTS

        weights = _weights_name(folder, HF_WEIGHTS)
        save = "save the whole pair (model.save_pretrained)"
        with _quiet_transformers():
            try:  # sizes that disagree with the weights are reported below, naming the field, not as the library's
                model, info = transformers.AutoModel.from_pretrained(folder, local_files_only=True,
                                                                     output_loading_info=True,
                                                                     ignore_mismatched_sizes=True)
            except (OSError, ValueError, ImportError, RuntimeError) as e:
                raise VitdeployError(f"{folder}: transformers cannot load the pair ({_first_line(e)})") from None
            try:
                self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
            except Exception as e:  # noqa: BLE001 - tokenizers raise Exception, RuntimeError, JSONDecodeError ...
                raise tokenizer_error(folder, e) from None
        missing = sorted(k for k in info.get("missing_keys", ()) if not k.startswith("vision_model."))
        if missing:
            raise _missing_text(folder, weights, missing, save)
        mismatched = sorted((str(k), list(a), list(b)) for k, a, b in info.get("mismatched_keys", ()))
        if mismatched:
            key, saved, made = mismatched[0]
            field = next((f for part, f in _HF_SIZED_BY if part in key), "its sizes")
            raise BadField(f"{folder / HF_CONFIG}: {field} makes {key} {made}, but {weights} holds {saved}: the config "
                           f"is not the weights'; fix {field} in {HF_CONFIG}, or {save}")
        self.model = model.float().eval()
        self.source = model_type
        where = str(folder / weights)
        self.logit_scale = _finite_scalar(self.model, "logit_scale", where, exp=True) or 1.0
        self.logit_bias = _finite_scalar(self.model, "logit_bias", where) or 0.0
        self.context = int(self.model.config.text_config.max_position_embeddings)
        self.context_field = f"text_config.max_position_embeddings in {folder / HF_CONFIG}"
        emb = getattr(getattr(getattr(self.model, "text_model", None), "embeddings", None), "token_embedding", None)
        self.vocab_rows = int(emb.num_embeddings) if emb is not None else None
        self.tokenizer_where = f"{folder}/{_tokenizer_files(folder) or 'tokenizer'}"
        self.padding = HF_PAIRS[model_type]
        self.encodes_ids = True

    def ids(self, prompts: list[str]) -> list[list[int]]:
        with _quiet_transformers():  # "longer than the specified maximum sequence length": refused by the caller
            return [list(x) for x in self.tokenizer(prompts, truncation=False, padding=False)["input_ids"]]

    def _padding(self) -> dict[str, Any]:
        pad: dict[str, Any] = {"padding": self.padding}
        if self.padding == "max_length":  # SigLIP: padded to its context, as it was trained
            pad["max_length"] = self.context
        return pad

    def encode(self, prompts: list[str]) -> torch.Tensor:
        return self._features(self.tokenizer(prompts, return_tensors="pt", truncation=False, **self._padding()))

    def encode_ids(self, ids: list[list[int]]) -> torch.Tensor:
        """The ids of ``ids`` (the tokenizer's own call, uncut, unpadded) padded by the tokenizer's own ``pad``: the
        tensors its call with padding makes, without tokenising again."""
        with _quiet_transformers():  # "with a fast tokenizer, __call__ is faster": not for ids it has made already
            return self._features(self.tokenizer.pad({"input_ids": ids}, return_tensors="pt", **self._padding()))

    def _features(self, enc: Any) -> torch.Tensor:
        import torch

        if int(enc["input_ids"].shape[1]) > self.context:  # class_embeddings checked every prompt's length first
            raise VitdeployError(f"internal: a prompt of {int(enc['input_ids'].shape[1])} tokens reached the text tower")
        out = self.model.get_text_features(**{k: enc[k] for k in ("input_ids", "attention_mask") if k in enc})
        return out if isinstance(out, torch.Tensor) else out.pooler_output  # transformers 5: a BaseModelOutputWithPooling


# open_clip's tensors → the open_clip_config.json field that sizes them
_OPEN_CLIP_SIZED_BY = (("positional_embedding", "model_cfg.text_cfg.context_length"),
                       ("token_embedding", "model_cfg.text_cfg.vocab_size"), ("text_projection", "model_cfg.embed_dim"),
                       ("visual.proj", "model_cfg.embed_dim"))
_SIZE_MISMATCH = re.compile(r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\((\[[^\]]*\])\) from "
                            r"checkpoint, the shape in current model is torch\.Size\((\[[^\]]*\])\)")


class OpenClipTextTower(TextTower):
    """open_clip's ``encode_text`` and ``get_tokenizer``, both from the folder (``local-dir:``), float32."""

    def __init__(self, folder: Path) -> None:
        try:
            import open_clip
        except ImportError:
            raise VitdeployError(f"--classes on an open_clip checkpoint runs its text tower with open_clip, which is "
                                 f"not installed: {INSTALL}") from None
        from vitdeploy.model.sources import OPEN_CLIP_WEIGHTS

        where = f"local-dir:{folder}"
        weights = _weights_name(folder, OPEN_CLIP_WEIGHTS)
        save = "save the whole model with save_for_hf"
        try:
            model = open_clip.create_model(where, precision="fp32", device="cpu")
        except ImportError as e:
            raise VitdeployError(f"{folder}: open_clip needs {_first_line(e)}: {INSTALL}") from None
        except Exception as e:  # noqa: BLE001 - open_clip raises RuntimeError/ValueError/KeyError on what it cannot build
            text = [k for k in re.findall(r'"([^"]+)"', str(e)) if not k.startswith("visual.")]
            if "Missing key" in str(e) and text:  # load_state_dict(strict=True): the weights lack the text tower
                raise _missing_text(folder, weights, text, save) from None
            m = _SIZE_MISMATCH.search(str(e))
            if m:
                key, saved, made = m.groups()
                field = next((f for part, f in _OPEN_CLIP_SIZED_BY if key.startswith(part)), "its sizes")
                raise BadField(f"{folder / OPEN_CLIP_CONFIG}: {field} makes {key} {made}, but {weights} holds {saved}: "
                               f"the config is not the weights'; fix {field} in {OPEN_CLIP_CONFIG}, or {save}") from None
            raise VitdeployError(f"{folder}: open_clip cannot load the model ({_first_line(e)})") from None
        try:
            self.tokenizer = open_clip.get_tokenizer(where)
        except Exception as e:  # noqa: BLE001 - an HF tokenizer beside the model: tokenizers' and json's errors
            raise tokenizer_error(folder, e) from None
        self.model = model.eval()
        self.source = "open_clip"
        wf = str(folder / weights)
        self.logit_scale = _finite_scalar(self.model, "logit_scale", wf, exp=True) or 1.0
        self.logit_bias = _finite_scalar(self.model, "logit_bias", wf) or 0.0
        self.context = int(getattr(self.tokenizer, "context_length", None) or self.model.context_length)
        self.context_field = f"model_cfg.text_cfg.context_length in {folder / OPEN_CLIP_CONFIG}"
        emb = getattr(self.model, "token_embedding", None) or getattr(getattr(self.model, "text", None),
                                                                      "token_embedding", None)
        rows = getattr(emb, "num_embeddings", None)
        self.vocab_rows = rows if isinstance(rows, int) else None
        files = _tokenizer_files(folder) if type(self.tokenizer).__name__ != "SimpleTokenizer" else None
        self.tokenizer_where = f"{folder}/{files}" if files else "open_clip's CLIP tokenizer"

    def ids(self, prompts: list[str]) -> list[list[int]]:
        """What open_clip's tokenizer makes of each prompt before it pads or cuts to the context (its own cleaning,
        its own special tokens)."""
        from open_clip import tokenizer as oct

        tok = self.tokenizer
        if isinstance(tok, oct.SimpleTokenizer):
            return [[tok.sot_token_id, *tok.encode(p), tok.eot_token_id] for p in prompts]
        if isinstance(tok, oct.HFTokenizer):
            texts = [tok.clean_fn(p) for p in prompts]
            if tok.tokenizer_mode == "clips":  # bos + text + eos, then the class token at the end
                return [[0, *x, 0, 0] for x in tok.tokenizer(texts, add_special_tokens=False)["input_ids"]]
            return [list(x) for x in tok.tokenizer(texts, truncation=False)["input_ids"]]
        if isinstance(tok, oct.SigLipTokenizer):
            texts = [oct.canonicalize_text(oct.basic_clean(p)) for p in prompts]
            return [list(x) for x in tok.tokenizer(texts, truncation=False)["input_ids"]]
        raise VitdeployError(f"open_clip's {type(tok).__name__}: vitdeploy cannot count its tokens, so it cannot tell "
                             "a prompt it would cut; use a model with open_clip's CLIP, HF or SigLIP tokenizer")

    def encode(self, prompts: list[str]) -> torch.Tensor:
        return self.model.encode_text(self.tokenizer(prompts))


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return (s.splitlines()[0][:160] if s else type(e).__name__)


# --- the text tower's sizes: from its config, within core/limits, and the weights' (before anything is allocated) --


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """The tensors' shapes from a safetensors file's header, nothing else read; {} where it is not one (the loader
    names that later)."""
    import json
    import struct

    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                return {}
            (n,) = struct.unpack("<Q", head)
            if n > 256 << 20:
                return {}
            meta = json.loads(fh.read(n))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(meta, dict):
        return {}
    return {k: list(v["shape"]) for k, v in meta.items() if isinstance(v, dict) and isinstance(v.get("shape"), list)}


def _against_weights(fields: Fields, sized: Sequence[tuple[str, str, int]], weights: Path) -> None:
    """Each (field, tensor, dim) whose config value is not the weights' size: refused naming the field and the tensor
    (open_clip resizes a context length that disagrees without a word, transformers reports it in a log)."""
    shapes = _safetensors_shapes(weights) if weights.is_file() else {}
    for name, key, dim in sized:
        shape = shapes.get(key)
        if shape and len(shape) > dim and fields.has(name) and fields.obj[name] != shape[dim]:
            raise fields.refuse(name, fields.obj[name], f"the weights' {shape[dim]} ({key} is {shape} in {weights.name})")


def check_open_clip_text_sizes(f: Path, model_cfg: dict[str, Any]) -> None:
    """open_clip_config.json's text tower and embedding sizes within core/limits (a context_length of 10**9 asked 256
    GB) and equal to the weights' (safetensors header): one line naming the field, before open_clip allocates."""
    mc = Fields(f, model_cfg, "model_cfg.")
    tc = mc.sub("text_cfg")
    if tc is None or tc.has("hf_model_name"):  # a transformers text model: its own config, from the hub
        return
    for name, idea in (("context_length", "context_length"), ("vocab_size", "vocab_size"), ("width", "width"),
                       ("heads", "heads"), ("layers", "depth")):
        if tc.has(name):
            tc.integer(name, idea=idea)
    if mc.has("embed_dim"):
        mc.integer("embed_dim", idea="width")
    weights = f.parent / "open_clip_model.safetensors"
    _against_weights(tc, (("context_length", "positional_embedding", 0), ("vocab_size", "token_embedding.weight", 0),
                          ("width", "token_embedding.weight", 1)), weights)
    _against_weights(mc, (("embed_dim", "text_projection", 1), ("embed_dim", "visual.proj", 1)), weights)


def check_hf_text_sizes(f: Path, cfg: dict[str, Any]) -> None:
    """config.json's text_config sizes within core/limits and equal to the weights' (safetensors header)."""
    cf = Fields(f, cfg, null_is_default=True)
    tc = cf.sub("text_config")
    if tc is None:
        return
    for name, idea in (("max_position_embeddings", "context_length"), ("vocab_size", "vocab_size"),
                       ("hidden_size", "width"), ("intermediate_size", "width"), ("num_hidden_layers", "depth"),
                       ("num_attention_heads", "heads"), ("projection_size", "width")):
        if tc.has(name):
            tc.integer(name, idea=idea)
    if cf.has("projection_dim"):
        cf.integer("projection_dim", idea="width")
    _against_weights(tc, (("max_position_embeddings", "text_model.embeddings.position_embedding.weight", 0),
                          ("vocab_size", "text_model.embeddings.token_embedding.weight", 0)), f.parent / "model.safetensors")


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
        check_open_clip_text_sizes(f, model_cfg)
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
        check_hf_text_sizes(f, cfg)
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


PROMPTS_PER_BATCH = 1024  # prompts a forward of the text tower (and a tokenizer call): whole classes, at least one
SAME_COSINE = 0.9999  # two class vectors this close cannot be told apart by the classifier (issue 40, C)


def _short(text: str, limit: int = 40) -> str:
    t = printable(text)
    return t if len(t) <= limit else f"{t[:limit]}… ({len(text):,} characters)"


def check_prompt_count(n_classes: int, n_templates: int, where: str = "--classes") -> None:
    """classes × templates within core/limits ``prompts`` (and the classes within ``classes``): past it, one line
    before any weights are read."""
    from vitdeploy.core.limits import bounds

    top, most = int(bounds("prompts")["max"]), int(bounds("classes")["max"])
    if n_classes > most:
        raise UsageError(f"{where}: {n_classes:,} class names, more than the {most:,} a classifier may have "
                         "(core/limits.py); split the list")
    if n_classes * n_templates > top:
        raise UsageError(f"{where}: {n_classes:,} classes × {n_templates} templates = {n_classes * n_templates:,} "
                         f"prompts, more than the {top:,} one import encodes (core/limits.py); split the class list or "
                         "use fewer templates (--templates simple has 7)")


def _batches(n_classes: int, n_templates: int) -> Iterator[tuple[int, int]]:
    step = max(1, PROMPTS_PER_BATCH // max(1, n_templates))
    for start in range(0, n_classes, step):
        yield start, min(n_classes, start + step)


def _check_prompts(tower: TextTower, classes: Sequence[str], templates: Sequence[str],
                   progress: Callable[..., None] | None, kept: list[tuple[Any, Any]] | None = None) -> list[int]:
    """Every prompt tokenised uncut: one past the tower's context is refused naming the template, the class and the
    token count (the library would cut it, and a cut that falls before the class name gives every class one vector);
    a token id past the embedding table is refused naming the tokenizer. Each class's token ids, hashed (the cause
    of two equal class vectors, when it is the tokenizer). ``kept``: each batch's ids appended, packed as int32
    (all of them and each prompt's length: about 4 bytes a token, 50 MB for 800,000 prompts), for the encode pass."""
    import numpy as np

    total = len(classes) * len(templates)
    signatures: list[int] = []
    for start, stop in _batches(len(classes), len(templates)):
        prompts = [t.format(c) for c in classes[start:stop] for t in templates]
        ids = tower.ids(prompts)
        for k, row in enumerate(ids):
            ci, ti = start + k // len(templates), k % len(templates)
            if len(row) > tower.context:
                raise UsageError(
                    f"the prompt of class '{_short(classes[ci])}' (line {ci + 1} of --classes) in template "
                    f"'{_short(templates[ti], 60)}' is {len(row):,} tokens, past the {tower.context} the text tower reads "
                    f"({tower.context_field}); vitdeploy does not cut prompts (a cut one can lose the class name): "
                    "shorten the class name or the template")
            top = max(row, default=0)
            if tower.vocab_rows is not None and (top >= tower.vocab_rows or min(row, default=0) < 0):
                raise BadField(f"{tower.tokenizer_where}: the tokenizer gives token id {top} for "
                               f"'{_short(prompts[k], 60)}', past the text model's {tower.vocab_rows} embeddings (its "
                               "vocab_size): this tokenizer is not the model's; save the pair's own tokenizer beside it")
        signatures += [hash(tuple(tuple(r) for r in ids[i:i + len(templates)])) for i in range(0, len(ids), len(templates))]
        if kept is not None:
            kept.append((np.fromiter((t for r in ids for t in r), dtype=np.int32),
                         np.fromiter((len(r) for r in ids), dtype=np.int64, count=len(ids))))
        if progress:
            progress(stop * len(templates), total, "checking prompts")
    return signatures


def _refuse_same_vectors(w: torch.Tensor, classes: Sequence[str], signatures: Sequence[int], tower: TextTower,
                         progress: Callable[..., None] | None) -> None:
    """Two distinct class names whose vectors have a cosine above SAME_COSINE: refused naming both, whatever the
    cause (a foreign or empty vocabulary, a tokenizer mapping every name to the same tokens). Blocks of rows against
    the rows after them, within about 64M similarities a block."""
    import torch

    n = int(w.shape[0])
    step = max(1, min(2048, (64 << 20) // max(1, n)))
    for i in range(0, n, step):
        block = w[i:i + step] @ w[i:].T  # [b, n - i]
        b = int(block.shape[0])
        block[:, :b].masked_fill_(torch.ones(b, b, dtype=torch.bool).tril(), -2.0)  # itself and the rows before
        hits = (block > SAME_COSINE).nonzero()
        if len(hits):
            r, c = (int(v) for v in hits[0])
            a, z = i + r, i + c
            cause = (f"the tokenizer ({tower.tokenizer_where}) turns both into the same tokens"
                     if signatures[a] == signatures[z] else "the text tower does not separate them")
            raise VitdeployError(
                f"classes '{_short(classes[a])}' (line {a + 1}) and '{_short(classes[z])}' (line {z + 1}) get the same "
                f"text vector (cosine {float(block[r, c]):.6f}): the classifier could not tell them apart; {cause}. "
                "Rename one of them, or check that the tokenizer is the pair's own")
        if progress:
            progress(min(n, i + step), n, "comparing classes")


def class_embeddings(tower: TextTower, classes: Sequence[str], templates: Sequence[str],
                     progress: Callable[..., None] | None = None) -> torch.Tensor:
    """W [classes, dim], float32: per class, the mean of the L2-normalised text features of its prompts, normalised
    again (open_clip's build_zero_shot_classifier), PROMPTS_PER_BATCH prompts a tokenizer call and a forward.

    First every prompt is tokenised and checked (none is cut: _check_prompts), so a long list is refused in seconds,
    not after its encoding; last, two classes with the same vector are refused (_refuse_same_vectors).
    ``progress(done, total, phase)`` follows each pass ("checking prompts", "text tower" in prompts, "comparing
    classes" in classes)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    check_prompt_count(len(classes), len(templates))
    kept: list[tuple[Any, Any]] | None = [] if tower.encodes_ids else None
    signatures = _check_prompts(tower, classes, templates, progress, kept)
    total = len(classes) * len(templates)
    rows = []
    with torch.no_grad():
        for b, (start, stop) in enumerate(_batches(len(classes), len(templates))):
            if kept is not None:  # the ids the check pass made: tokenised once
                flat, lengths = kept[b]
                kept[b] = (None, None)  # freed as it goes
                tokens, ends = flat.tolist(), [0, *np.cumsum(lengths).tolist()]
                emb = tower.encode_ids([tokens[ends[i]:ends[i + 1]] for i in range(len(ends) - 1)])
            else:
                prompts = [t.format(c) for c in classes[start:stop] for t in templates]
                emb = tower.encode(prompts)
            emb = F.normalize(emb.float(), dim=-1)
            emb = emb.reshape(stop - start, len(templates), -1).mean(dim=1)
            rows.append(F.normalize(emb, dim=-1))
            if progress:
                progress(stop * len(templates), total, "text tower")
        w = torch.cat(rows)
        if not torch.isfinite(w).all():
            raise VitdeployError("the text tower answered NaN or Inf for some prompts; the class embeddings are unusable")
        _refuse_same_vectors(w, classes, signatures, tower, progress)
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
    if templates is not None:
        check_prompt_count(len(classes), len(templates), f"--classes {request.classes}")
    folder, kind = open_pair(source)
    return folder, kind, classes, templates


def plan_zero_shot(source: str | Path, request: ZeroShotRequest) -> ZeroShotPlan:
    """check_zero_shot, then the named template table (open_clip's): before any weights are read."""
    folder, kind, classes, templates = check_zero_shot(source, request)
    if templates is None:
        templates = read_templates(request.templates)
        check_prompt_count(len(classes), len(templates), f"--classes {request.classes}")
    return ZeroShotPlan(folder, kind, classes, templates)


def zero_shot_classifier(image: Checkpoint, plan: ZeroShotPlan,
                         progress: Callable[..., None] | None = None) -> Checkpoint:
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
