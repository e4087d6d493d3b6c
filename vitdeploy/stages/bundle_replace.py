"""``bundle --force`` over an earlier bundle: replace what that bundle wrote, keep everything else, name what was kept.

A bundle folder gathers what the bundle never wrote: engines and a ``timing.cache`` built on the device, the C++
example's ``cpp/build/``, results and notes. ``--force`` must not delete them. The bundle knows what it wrote: its
``manifest.json`` lists every file with its SHA-256 (``bundle.files``). So ``--force`` replaces exactly those files
(as the bundle wrote them) and keeps every other entry:

* kept where it is: a file the user added (results, notes, ``timing.cache``, ``cpp/build/``), and an engine built
  on the device (``*.engine``, ``*.plan``, ``*.trt`` with its ``.json`` sidecar and ``.dla`` note) while the models
  it was built from are unchanged (every ONNX file's SHA-256 and the batch profile are the same);
* moved to ``earlier/`` (same relative path): such an engine once the models changed, so run.py, build_engine.sh,
  Triton and DeepStream never take an engine of the earlier models silently (lineage); a file the bundle wrote
  that was changed since (an edited ``config.pbtxt``); a user's file at a name the new bundle writes.

Each kept or moved entry is named. A bundle written before ``bundle.files`` existed: its files are those its
manifest names and those the new bundle writes (a changed one cannot be told there, and is replaced).

The swap stays all-or-nothing for the bundle: the finished bundle is renamed into place, the earlier folder set
aside as ``.NAME.vitdeploy-replaced-PID`` (not a temporary name: no later run removes it, so a run killed half way
leaves the user's files there, never deleted), the user's entries are renamed across, then only the files the
earlier bundle wrote are removed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from vitdeploy.core.errors import UsageError
from vitdeploy.core.fileio import sha256_file
from vitdeploy.core.naming import ENGINE_SUFFIXES

EARLIER = "earlier"  # where entries the new bundle must not leave in place are moved (inside the bundle)
ENGINE_COMPANIONS = (".json", ".dla")  # an engine's sidecar (vitdeploy build-engine) and DLA note (build_engine.sh)


def written_files(root: Path, artifacts: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Every file under ``root`` but manifest.json, with its SHA-256 (an artifact's recorded one, else hashed)."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.is_symlink():
            continue
        rel = p.relative_to(root).as_posix()
        if rel == "manifest.json":
            continue
        sha = (artifacts.get(rel) or {}).get("sha256")
        out[rel] = str(sha) if sha else sha256_file(p)
    return out


def is_engine_file(rel: str) -> bool:
    """An engine or its companion file, built on the device from one of the bundle's models."""
    name = rel.rsplit("/", 1)[-1]
    for suf in ENGINE_SUFFIXES:
        if name.endswith(suf) or any(name.endswith(suf + c) for c in ENGINE_COMPANIONS):
            return True
    return False


def _manifest(folder: Path) -> dict[str, Any]:
    try:
        d = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def _bundle_block(man: dict[str, Any]) -> dict[str, Any]:
    b = man.get("bundle")
    return b if isinstance(b, dict) else {}


def _models_of(block: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """What an engine depends on: every model file's SHA-256 and the batch profile."""
    arts = block.get("artifacts") or {}
    shas = {k: v.get("sha256") for k, v in arts.items() if isinstance(v, dict)} if isinstance(arts, dict) else {}
    return shas, block.get("batch")


def _named_by(block: dict[str, Any]) -> set[str]:
    """The files an earlier bundle's manifest names (for a bundle written before ``bundle.files``)."""
    names: set[str] = set()
    arts = block.get("artifacts")
    if isinstance(arts, dict):
        names |= set(map(str, arts))
    ref = block.get("reference") or {}
    if isinstance(ref, dict):
        names |= {str(v) for v in (ref.get("images") or []) if isinstance(v, str)}
        names |= {str(ref["inputs"])} if isinstance(ref.get("inputs"), str) else set()
        for key in ("logits", "embeddings"):  # a classifier's reference outputs, an embedding model's
            names |= {str(v) for v in (ref.get(key) or {}).values() if isinstance(v, str)}
    tri = block.get("triton") or {}
    if isinstance(tri, dict) and isinstance(tri.get("name"), str):
        names |= {f"triton/{tri['name']}/{f}" for f in ("config.pbtxt", "labels.txt", "1/model.onnx")}
    ds = block.get("deepstream") or {}
    if isinstance(ds, dict):
        names |= {str(v) for v in ds.values() if isinstance(v, str)}
    return names


def _entries(folder: Path) -> list[str]:
    """Every file, symlink and empty folder under ``folder`` (relative, posix; links not followed)."""
    out: list[str] = []
    for dirpath, dirs, files in os.walk(folder):
        d = Path(dirpath)
        for name in list(dirs):
            if (d / name).is_symlink():  # a link to a folder is an entry of its own, never walked into
                out.append((d / name).relative_to(folder).as_posix())
                dirs.remove(name)
        out += [(d / f).relative_to(folder).as_posix() for f in files]
        if not dirs and not files and d != folder:
            out.append(d.relative_to(folder).as_posix())
    return sorted(out)


def _as_written(path: Path, sha: str) -> bool:
    """Whether the file is still as the bundle wrote it."""
    return path.is_file() and not path.is_symlink() and sha256_file(path) == sha


def _earlier(out: Path) -> str:
    """The folder entries are moved to: ``earlier``, or ``earlier-N`` where the user has a file or a link of that
    name (a link is never written through: it may point outside the bundle)."""
    name, n = EARLIER, 1
    while (out / name).is_symlink() or ((out / name).exists() and not (out / name).is_dir()):
        name, n = f"{EARLIER}-{n}", n + 1
    return name


def _free(out: Path, folder: str, rel: str, taken: set[str]) -> str:
    """``folder/rel``, or ``folder/rel.N`` where that is taken; flattened (``a__b``) where a folder on the way is a
    link or a file of the user's, so nothing is ever moved through a link out of the bundle."""
    parts = Path(rel).parts
    for i in range(1, len(parts)):
        step = out / folder / Path(*parts[:i])
        if step.is_symlink() or (step.exists() and not step.is_dir()):
            rel = "__".join(parts)
            break
    dest, n = f"{folder}/{rel}", 1
    while dest in taken or (out / dest).exists() or (out / dest).is_symlink():
        dest, n = f"{folder}/{rel}.{n}", n + 1
    return dest


def plan(out: Path, new_root: Path) -> tuple[list[tuple[str, str]], set[str], list[str]]:
    """What to do with each entry of the earlier bundle ``out`` when ``new_root`` replaces it: (entries to carry
    over as (from, to) relative paths, the earlier bundle's own files to remove, one line per kept or moved entry)."""
    old_block = _bundle_block(_manifest(out))
    new_block = _bundle_block(_manifest(new_root))
    new_entries = set(_entries(new_root))
    new_dirs = {str(Path(e).parent.as_posix()) for e in new_entries}
    new_dirs = {p for d in new_dirs for p in [d, *(q.as_posix() for q in Path(d).parents)]} - {"."}
    raw = old_block.get("files")
    legacy = not isinstance(raw, dict)
    recorded: dict[str, Any] = raw if isinstance(raw, dict) else {}
    known: set[str] = (_named_by(old_block) | new_entries) if legacy else set(recorded)
    same_models = _models_of(old_block) == _models_of(new_block) and bool(_models_of(old_block)[0])
    earlier = _earlier(out)
    carry: list[tuple[str, str]] = []
    remove: set[str] = {"manifest.json"}
    kept: list[str] = []
    moved: list[str] = []
    taken = {e for e in _entries(out) if e.startswith(earlier + "/")}
    for rel in _entries(out):
        if rel == "manifest.json":
            continue
        path = out / rel
        if path.is_dir() and not path.is_symlink() and rel in new_dirs:  # an empty folder the new bundle has too
            continue
        if rel in known and (legacy or _as_written(path, str(recorded[rel]))):
            remove.add(rel)
            continue
        changed_own = rel in known  # the bundle wrote it, the user changed it since
        collides = rel in new_entries or rel in new_dirs or any(p.as_posix() in new_entries for p in Path(rel).parents)
        stale_engine = is_engine_file(rel) and not same_models
        if changed_own or collides or stale_engine:
            dest = _free(out, earlier, rel, taken)
            taken.add(dest)
            carry.append((rel, dest))
            why = ("built from the earlier models: rebuild it with ./build_engine.sh" if stale_engine else
                   "changed since the bundle wrote it" if changed_own else "the new bundle writes that name")
            moved.append(f"{rel} -> {dest} ({why})")
        else:
            carry.append((rel, rel))
            kept.append(rel)
    lines = []
    if kept:
        lines.append(f"kept {len(kept)} file(s) the bundle did not write: {', '.join(kept)}")
    lines += [f"moved {m}" for m in moved]
    return carry, remove, lines


def replace_bundle(tmp: Path, out: Path, force: bool) -> list[str]:
    """Move the finished bundle ``tmp`` into place; an existing bundle is replaced only with ``force``, and only
    now, keeping every entry it did not write (see the module docstring). One line per kept or moved entry."""
    if not out.exists():
        os.replace(tmp, out)
        return []
    if not force:
        raise UsageError(f"{out} exists; pass --force to replace it, or choose another -o")
    carry, remove, lines = plan(out, tmp)
    old = out.with_name(f".{out.name}.vitdeploy-replaced-{os.getpid()}")
    if old.exists():  # this process's own earlier leftovers (a pid is not reused while it runs)
        raise UsageError(f"{old} exists (an earlier replacement of {out} did not finish): move what you need out of "
                         "it and remove it")
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except OSError:
        os.replace(old, out)
        raise
    for src, dest in carry:
        target = out / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(old / src, target)
    for rel in remove:
        (old / rel).unlink(missing_ok=True)
    left = _entries(old)
    if any((old / e).is_file() or (old / e).is_symlink() for e in left):  # written there while the bundle ran
        lines.append(f"left {old} in place: it holds files that appeared while the bundle was written")
    else:
        shutil.rmtree(old)
    return lines
