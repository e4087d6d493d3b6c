"""What a checkpoint path names, decided without torch: the refusals made before any weights are read.

``load_any`` (model/importers.py) and ``load_checkpoint`` (model/checkpoint.py) read weights with torch; a path they
would refuse without reading it (a folder without config.json, a missing or empty file, a legacy torch.save pickle,
a file that is no zip) is refused here, by the same words, so a caller such as export says it before torch is
imported (a second of CPU for one line otherwise). Both loaders call these checks first: one set of rules.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

from vitdeploy.core.bundle_paths import bundle_file, link_root, read_bundle_text
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.limits import bounds

HF_CONFIG = "config.json"
# open_clip's save_for_hf (open_clip/constants.py HF_CONFIG_NAME): model_cfg + preprocess_cfg beside the weights
OPEN_CLIP_CONFIG = "open_clip_config.json"
HF_PREPROCESSOR = "preprocessor_config.json"
HF_PROCESSOR = "processor_config.json"  # a multi-part processor (CLIPProcessor): the image processor's part inside

# The weights a folder's loader reads: the first of these there, in each library's preference.
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TIMM_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # timm's save_for_hf (timm/models/_hub.py)
# What open_clip's save_for_hf writes (open_clip/constants.py HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME).
OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
# The other files a folder's model is made of, where present: its configs, and the tokenizer --classes reads.
FOLDER_CONFIGS = (HF_CONFIG, HF_PREPROCESSOR, HF_PROCESSOR, OPEN_CLIP_CONFIG, "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "spiece.model",
                  "sentencepiece.bpe.model", "tokenizer.model")

# torch.save's legacy (pre-1.6, non-zip) format opens with this number pickled: torch/serialization.py MAGIC_NUMBER
LEGACY_TORCH_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_MESSAGE = "a legacy torch.save file: re-save it with torch>=1.6's zip format"


def is_hf_folder(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / HF_CONFIG).is_file()


def is_open_clip_folder(path: str | Path) -> bool:
    """A folder open_clip's save_for_hf wrote (and no transformers/timm config.json beside it)."""
    p = Path(path)
    return p.is_dir() and (p / OPEN_CLIP_CONFIG).is_file() and not (p / HF_CONFIG).is_file()


def _read_head(path: str | Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(32)  # not the whole file: a multi-GB file that is no zip is refused as quickly


def _legacy_head(head: bytes) -> bool:
    """Whether a file's first 32 bytes open torch.save's legacy pickle format."""
    if not head.startswith(b"\x80") or len(head) < 3:
        return False
    magic = LEGACY_TORCH_MAGIC.to_bytes(10, "little")  # pickle's LONG1 opcode (0x8a), 10 bytes, little-endian
    return b"\x8a\x0a" + magic in head[:16]


def is_legacy_torch_file(path: str | Path) -> bool:
    """Whether a file is in torch.save's legacy pickle format (``_use_new_zipfile_serialization=False``)."""
    return _legacy_head(_read_head(path))


def check_checkpoint_file(p: Path) -> None:
    """``load_checkpoint``'s refusals before ``torch.load``: missing, a folder, empty, or not a zip file (a legacy
    torch.save pickle, a truncated file, another format)."""
    if not p.exists():
        raise VitdeployError(f"{p}: no such checkpoint; train one with `vitdeploy train` or pass its path")
    if p.is_dir():
        raise VitdeployError(f"{p} is a folder, not a vitdeploy checkpoint file")
    if p.stat().st_size == 0:
        raise VitdeployError(f"{p}: empty file, not a checkpoint")
    if not zipfile.is_zipfile(p):
        head = _read_head(p)
        if _legacy_head(head):
            raise VitdeployError(f"{p}: {LEGACY_MESSAGE}")
        what = "a truncated or corrupt checkpoint" if head.startswith(b"PK") else "not a PyTorch checkpoint"
        raise VitdeployError(f"{p}: {what}; re-create it with `vitdeploy train`")


def check_source(path: str | Path, arch: str | None = None) -> Path:
    """``load_any``'s refusals that need no torch, in its order; the path it reads (a config.json names its folder).

    What is left for torch to judge: a Hugging Face folder's files, a .safetensors file, a zip file's contents.
    """
    p = Path(path)
    if p.is_file() and p.name in (HF_CONFIG, OPEN_CLIP_CONFIG):
        p = p.parent
    if p.is_dir():
        if not is_hf_folder(p) and not is_open_clip_folder(p):
            raise VitdeployError(
                f"{p} is a folder without config.json: pass a vitdeploy checkpoint file, a Hugging Face "
                "save_pretrained folder, an open_clip save_for_hf folder, or a timm state dict with --arch"
            )
        if arch:
            raise UsageError(f"--arch {arch}: a Hugging Face or open_clip folder describes its architecture in its "
                             "config; drop --arch")
        return p
    if not p.exists():
        raise VitdeployError(f"{p}: no such checkpoint; train one with `vitdeploy train` or pass its path")
    if p.suffix != ".safetensors":
        check_checkpoint_file(p)  # names the problem (empty, legacy, truncated, not a PyTorch file)
    return p


# --- the files a folder's model is made of ------------------------------------------------------------------------

_SHARD_FIX = "name shard files beside the index, as save_pretrained writes them"


def folder_file(folder: Path, name: str, what: str, fix: str = _SHARD_FIX) -> Path:
    """A file a folder's index or loader names, under the bundle's rule (core/bundle_paths.py): a relative path inside
    the folder (symlinks too), a regular file of a bounded size; else one line naming ``what`` and the entry."""
    limit = int(bounds("weights_file_bytes")["max"])
    return bundle_file(folder, name, what, limit, inside=f"{folder}", fix=fix, within=link_root(folder))


def index_shards(folder: Path, index: str) -> list[str]:
    """The shard files a sharded index (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``) names in
    its ``weight_map``, each checked: the index a JSON object whose weight_map maps tensor names to file names, every
    file relative, inside the folder, regular and bounded. One line naming the index and the entry otherwise."""
    f = folder / index
    fix = "re-save the model with save_pretrained"
    try:
        text = read_bundle_text(folder, index, int(bounds("text_file_bytes")["max"]), what=f"{folder}:",
                                inside=str(folder), fix=fix, within=link_root(folder))
        data = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise VitdeployError(f"{f}: not a readable JSON shard index ({type(e).__name__}): {fix}") from None
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(data, dict):
        raise VitdeployError(f"{f}: a JSON {type(data).__name__}, not an object with a weight_map: {fix}")
    if not isinstance(wm, dict) or not wm:
        raise VitdeployError(f"{f}: weight_map is {_short(wm)}, not an object of tensor names and their shard files: "
                             f"{fix}")
    for k, v in wm.items():
        if not isinstance(v, str):
            raise VitdeployError(f"{f}: weight_map[{_short(k)}] is {_short(v)}, not a shard file name: {fix}")
    shards = sorted(set(wm.values()))
    for s in shards:
        if s and not s.startswith("/") and ".." not in s.split("/") and not os.path.lexists(folder / s):
            raise VitdeployError(f"{f}: weight_map names {s!r}, which is missing from {folder}: copy the whole "
                                 "folder, or save it again with save_pretrained")
        folder_file(folder, s, f"{f}: weight_map names")
    return shards


def _short(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def weights_parts(folder: Path, names: tuple[str, ...]) -> tuple[str, list[str]] | None:
    """The weights file a loader of ``folder`` reads (the first of ``names`` there, a file or a link to one) and the
    files the weights are made of: that file, or an index and its shards, each checked as ``folder_file`` says."""
    for name in names:
        if not (folder / name).is_file():
            continue
        folder_file(folder, name, f"{folder}:", fix="replace it with the weights file itself")
        return name, [name] + (index_shards(folder, name) if name.endswith(".index.json") else [])
    return None


def folder_weights_names(folder: Path) -> tuple[str, ...]:
    """Which weights names a folder's loader looks for: open_clip's, timm's (a config.json with ``architecture`` and
    no ``model_type``) or transformers'."""
    if is_open_clip_folder(folder):
        return OPEN_CLIP_WEIGHTS
    try:
        cfg = json.loads(read_bundle_text(folder, HF_CONFIG, int(bounds("text_file_bytes")["max"]),
                                          what=f"{folder}:", inside=str(folder), fix="fix the folder",
                                          within=link_root(folder)))
    except (VitdeployError, UnicodeDecodeError, ValueError, RecursionError):
        cfg = None
    timm = isinstance(cfg, dict) and cfg.get("model_type") is None and isinstance(cfg.get("architecture"), str)
    return TIMM_WEIGHTS if timm else HF_WEIGHTS


def folder_parts(folder: str | Path) -> list[str]:
    """The files of a model folder its model is made of, relative and sorted: the configs (and tokenizer) present and
    the weights its loader reads, with an index's shards. Import hashes these and only these (a 60 GB file beside the
    weights is never read), records them in ``source.files``, and lineage hashes the same list (core/lineage.py)."""
    d = Path(folder)
    parts = [n for n in FOLDER_CONFIGS if (d / n).is_file()]
    for n in parts:
        folder_file(d, n, f"{d}:", fix="replace it with the file itself")
    w = weights_parts(d, folder_weights_names(d))
    return sorted(set(parts + (w[1] if w else [])))


def check_output_outside(out: str | Path, source: str | Path) -> None:
    """Refuse (UsageError, exit 2), before any work, an output a loader of the input folder would read: its configs,
    its weights under any of the names the loaders look for (``FOLDER/model.safetensors`` beside pytorch_model.bin
    made a folder that no longer imports), the shards its index names. Another file in the folder is left to
    ``check_output`` (an existing file of an input folder is never written over)."""
    src = Path(source)
    folder = src.parent if src.is_file() and src.name in (HF_CONFIG, OPEN_CLIP_CONFIG) else src
    if not folder.is_dir():
        return
    o = Path(out)
    try:
        rel = str(Path(os.path.realpath(o)).relative_to(os.path.realpath(folder)))
    except ValueError:
        return
    read = set(FOLDER_CONFIGS + HF_WEIGHTS + TIMM_WEIGHTS + OPEN_CLIP_WEIGHTS)
    try:
        read.update(folder_parts(folder))
    except VitdeployError:
        pass  # the folder's own problem is said when it is read
    if rel in read:
        raise UsageError(f"-o {out} is a file of the input folder {folder} (its loader reads it): write the checkpoint "
                         "elsewhere (inputs are never written over)")
