"""Weight files read without the library that wrote them: state dicts (.pth/.bin/.safetensors, timm training
checkpoints), class-name files, and the check that weights fit the ViT a config describes. Shared by the Hugging
Face and timm importers (model/importers.py, model/timm_import.py)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import torch

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.loaded import hash_recorded, read_hashed
from vitdeploy.core.manifest import Manifest, tool_versions
from vitdeploy.model.checkpoint import describe_foreign, unwrap_state_dict
from vitdeploy.model.sources import LEGACY_MESSAGE, is_legacy_torch_file
from vitdeploy.model.vit import VisionTransformer, ViTConfig


def read_labels(path: str | Path, option: str = "--labels") -> list[str]:
    """Class names, one per line (blank lines at the end ignored), from a regular file of a bounded size
    (core/limits.py ``text_file_bytes``): a FIFO or /dev/zero is refused in one line before it is read."""
    from vitdeploy.core.fileio import NotAFileOfBoundedSize, read_bounded
    from vitdeploy.core.limits import bounds

    p = Path(path)
    try:
        lines = read_bounded(p, int(bounds("text_file_bytes")["max"])).decode("utf-8-sig").splitlines()
        # -sig: a BOM (Notepad) is not part of the first label
    except FileNotFoundError:
        raise UsageError(f"{option} {p}: no such file") from None
    except NotAFileOfBoundedSize as e:
        raise UsageError(f"{option} {p}: {e}; give a text file of class names, one per line") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{option} {p}: cannot read it as text ({type(e).__name__})") from None
    while lines and not lines[-1].strip():
        lines.pop()
    names = [ln.strip() for ln in lines]
    if not names:
        raise UsageError(f"{option} {p}: empty; write one class name per line")
    if any(not n for n in names):
        raise UsageError(f"{option} {p}: line {names.index('') + 1} is blank; write one class name per line")
    return names


def labels_for(path: str | Path, num_classes: int) -> list[str]:
    """The class names in ``path``, checked against the head's class count."""
    return _check_label_count(read_labels(path), num_classes, str(path))


def _check_label_count(labels: list[str], n: int, where: str) -> list[str]:
    if len(labels) != n:
        raise VitdeployError(
            f"{where} has {len(labels)} class names but the classifier head has {n} classes: give one name per class"
        )
    return labels


def torch_load(p: Path) -> Any:
    """torch.load(weights_only=True); timm's training checkpoints also hold argparse.Namespace ``args``, allowed here."""
    import argparse

    if p.suffix == ".npz":
        raise VitdeployError(f"{p}: JAX/NumPy .npz weights; load them in timm (which converts them) and save model.state_dict()")
    if not zipfile.is_zipfile(p):
        if is_legacy_torch_file(p):
            raise VitdeployError(f"{p}: {LEGACY_MESSAGE}")
        raise VitdeployError(f"{p}: not a PyTorch zip file or a safetensors file (truncated or another format)")
    allow = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5
    data, _ = read_hashed(p)  # lineage hashes the bytes loaded (core/loaded.py)
    try:
        if allow is None:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        with allow([argparse.Namespace]):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "weights_only" in msg or "Unsupported global" in msg:
            raise VitdeployError(f"{p}: holds pickled Python objects besides tensors; save its state_dict() alone") from None
        raise VitdeployError(f"{p}: a truncated or corrupt file ({msg[:80]})") from None


def _safetensors_load(p: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors, mapped by safetensors itself (``safe_open``): the file is never held in memory as
    bytes beside its tensors (a 20 GB model.safetensors was read whole, then parsed: twice its size in memory; now
    the tensors and one tensor's copy). Its SHA-256 is streamed first
    and its identity recorded, so a file replaced before the result is written is refused (core/loaded.py)."""
    from safetensors import SafetensorError, safe_open

    try:
        hash_recorded(p)
        with safe_open(str(p), framework="pt", device="cpu") as f:
            # each tensor copied out of the map, one at a time: a tensor left on the map would crash the process
            # (SIGBUS) when the file is truncated in place later (a `cp` over it while the import runs)
            return {k: f.get_tensor(k).clone() for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)
    except (SafetensorError, OSError, ValueError) as e:
        raise VitdeployError(f"{p}: not a readable safetensors file ({str(e)[:80]})") from None


def read_tensors(path: str | Path, loaded: Any = None) -> tuple[dict[str, torch.Tensor], str | None]:
    """The state dict in a .safetensors/.pth/.bin file, and which key of a training checkpoint it came from.

    Follows timm's own loader (``timm.models.load_state_dict(use_ema=True)``): ``state_dict_ema``,
    then ``model_ema``, ``state_dict``, ``model``; a DataParallel ``module.`` prefix is dropped.
    ``loaded``: the object already read from ``path`` (so it is not read twice).
    """
    p = Path(path)
    obj: Any = loaded
    if loaded is not None:
        pass
    elif not p.is_file():
        raise VitdeployError(f"{p}: no such file")
    elif p.stat().st_size == 0:
        raise VitdeployError(f"{p}: empty file, not a checkpoint")
    elif p.suffix == ".safetensors":
        obj = _safetensors_load(p)
    else:
        obj = torch_load(p)
    obj, key = unwrap_state_dict(obj)
    if not isinstance(obj, dict) or not any(isinstance(v, torch.Tensor) for v in obj.values()):
        raise VitdeployError(f"{p}: not a state dict — {describe_foreign(obj)}")
    return {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}, key


# The dtypes a model's weights may come in: cast to float32 without loss of meaning (fp64 rounds, fp16/bf16 widen).
# Anything else is no ViT weight: bool and integer tensors would become 0/1 or quantized codes without their scales,
# fp8 without its scaling factors, complex with its imaginary part dropped (torch warns once, nothing else).
WEIGHT_DTYPES = ("float32", "float16", "bfloat16", "float64")


# Integer tensors a foreign file may carry beside the weights: index buffers (position_ids, relative_position_index),
# dropped by the name mappers before _float32 sees the state.
INDEX_DTYPES = ("int32", "int64")


def check_weight_dtypes(sd: dict[str, torch.Tensor], where: str, allowed: tuple[str, ...] = WEIGHT_DTYPES) -> None:
    """One line naming the first tensor whose dtype is not ``allowed`` (issue 37, P2). Called on a file's tensors as
    read, before a mapper concatenates q, k and v (torch.cat would promote a bool or int8 block to float silently),
    and on the final state."""
    for k, v in sd.items():
        dtype = str(v.dtype).removeprefix("torch.")
        if dtype not in allowed:
            raise VitdeployError(f"{where}: tensor {k} is {dtype}, which no ViT weight is; vitdeploy reads "
                                 f"{', '.join(WEIGHT_DTYPES)} weights (dequantize or re-save them as float)")


def _float32(sd: dict[str, torch.Tensor], where: str = "the weights") -> dict[str, torch.Tensor]:
    """The model's tensors as float32; one line naming the first tensor of another kind."""
    check_weight_dtypes(sd, where)
    return {k: v.float().contiguous() for k, v in sd.items()}


def _check_fits(state: dict[str, torch.Tensor], cfg: ViTConfig, where: str) -> None:
    """Compare names and shapes with the model the config describes, on the meta device (no memory)."""
    with torch.device("meta"):
        ref = VisionTransformer(cfg).state_dict()
    missing = [k for k in ref if k not in state]
    extra = [k for k in state if k not in ref]
    wrong = [f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in ref.items() if k in state and state[k].shape != v.shape]
    if missing or extra or wrong:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:3])}")
        if extra:
            parts.append(f"unexpected {', '.join(extra[:3])}")
        if wrong:
            parts.append(f"shape {'; '.join(wrong[:2])}")
        raise VitdeployError(f"{where}: the weights do not fit the architecture ({'; '.join(parts)})")


def _manifest(cfg: ViTConfig, labels: list[str], pp: dict[str, Any], name: str, source: dict[str, Any]) -> Manifest:
    """An imported checkpoint's manifest, its task recorded (core/task.py): a classifier, or the embedding model a
    backbone is (its dimension, pooling, projection, registers), so info and every later step read it as such."""
    from vitdeploy.core.task import task_from_model

    model = cfg.to_dict()
    return Manifest(
        model=model,
        labels=labels,
        preprocess=pp,
        name=name,
        source=source,
        versions=tool_versions("torch", "safetensors"),
        extra={"task": task_from_model(model).to_dict()},
    )


