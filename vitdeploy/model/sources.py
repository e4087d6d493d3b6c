"""What a checkpoint path names, decided without torch: the refusals made before any weights are read.

``load_any`` (model/importers.py) and ``load_checkpoint`` (model/checkpoint.py) read weights with torch; a path they
would refuse without reading it (a folder without config.json, a missing or empty file, a legacy torch.save pickle,
a file that is no zip) is refused here, by the same words, so a caller such as export says it before torch is
imported (a second of CPU for one line otherwise). Both loaders call these checks first: one set of rules.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from vitdeploy.core.errors import UsageError, VitdeployError

HF_CONFIG = "config.json"
# open_clip's save_for_hf (open_clip/constants.py HF_CONFIG_NAME): model_cfg + preprocess_cfg beside the weights
OPEN_CLIP_CONFIG = "open_clip_config.json"

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
