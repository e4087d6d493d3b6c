"""`vitdeploy info`: what an artifact says about itself, and whether what it was made from is still beside it.

Every artifact carries one manifest (checkpoint, ONNX metadata, engine sidecar, a bundle's manifest.json) and every
derived one records the SHA-256 of its source. This reads the manifest once and walks that chain: for each link the
recorded SHA-256 is compared with the file of that name beside the artifact — current, stale (the file changed since:
the artifact was made from an older model) or missing. Nothing is loaded into a runtime; a checkpoint is read by the
model layer (torch), everything else as JSON/protobuf headers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy.core.errors import UnreadableArtifact, UsageError, VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.text import printable_list

ENGINE_SUFFIXES = (".engine", ".plan", ".trt")
CHECKPOINT_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors")
MAX_DEPTH = 8  # a chain is checkpoint -> onnx -> int8/fp16 -> engine; deeper means a loop in hand-edited manifests


@dataclass
class Link:
    """One lineage link: ``artifact`` records ``source`` with ``recorded`` SHA-256; the file beside it has ``actual``."""

    artifact: str
    source: str
    recorded: str | None
    actual: str | None
    state: str  # current | stale | missing | unrecorded

    def to_dict(self) -> dict[str, Any]:
        return {"artifact": self.artifact, "source": self.source, "recorded_sha256": self.recorded,
                "actual_sha256": self.actual, "state": self.state}


@dataclass
class ArtifactInfo:
    """What `info` shows of one artifact."""

    path: Path
    kind: str  # checkpoint | onnx | engine | bundle
    manifest: Manifest
    lineage: list[Link] = field(default_factory=list)
    files: list[Link] = field(default_factory=list)  # a bundle's packed files against the SHA-256 it recorded

    @property
    def current(self) -> bool:
        """Every lineage link and every checked bundle file as recorded (a bundle file a user may edit, such as its
        README or a Triton config, is only 'edited': named, never a reason to call the models stale)."""
        return all(lk.state in ("current", "unrecorded", EDITED) for lk in [*self.lineage, *self.files])

    @property
    def damaged(self) -> list[Link]:
        """A bundle's models and reference files whose bytes are not the ones its manifest.json records (changed or
        missing): run.py --check would judge the device against them, so info fails on them (exit 1)."""
        return [lk for lk in self.files if lk.state in ("stale", "missing") and must_match(lk.source)]

    @property
    def edited(self) -> list[Link]:
        """A bundle's files a user may edit (README, Triton and DeepStream configs, scripts) changed since packing."""
        return [lk for lk in self.files if lk.state == EDITED]

    def to_dict(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "path": str(self.path), "kind": self.kind, "name": m.name, "precision": m.precision, "target": m.target,
            "classes": m.num_classes if "num_classes" in m.model else len(m.labels), "labels": m.labels,
            "preprocess": m.preprocess, "source": m.source, "lineage": [lk.to_dict() for lk in self.lineage],
            "files": [lk.to_dict() for lk in self.files], "current": self.current, "manifest": m.to_dict(),
            **_task_fields(m), **_family_fields(m),
        }


def _task_fields(m: Manifest) -> dict[str, Any]:
    """info --json's task (core/task.py): the manifest's entry, and its one line (``task_line``)."""
    task, line = _task(m)
    return {"task": task.to_dict() if task is not None else None, "task_line": line}


def _task(m: Manifest) -> tuple[Any, str]:
    """The task and its line; a damaged task entry is said, not raised (info shows what it can)."""
    from vitdeploy.core.task import task_of

    try:
        task = task_of(m)
    except (VitdeployError, TypeError, ValueError) as e:
        return None, f"unreadable ({e})"
    return task, task.describe()


def _family_fields(m: Manifest) -> dict[str, Any]:
    """info --json's family and features (model.family), for a manifest that describes a ViT."""
    from vitdeploy.model.family import family, features

    if not m.model or "embed_dim" not in m.model:
        return {}
    return {"family": family(m.model), "features": features(m.model)}


def kind_of(path: Path) -> str:
    if path.is_dir():
        if (path / "manifest.json").is_file():
            return "bundle"
        if (path / "config.json").is_file():
            return "checkpoint"  # a Hugging Face folder
        raise UsageError(f"{path}: a folder without manifest.json (not a bundle) or config.json (not a Hugging Face model)")
    if path.suffix == ".onnx":
        return "onnx"
    if path.suffix in ENGINE_SUFFIXES:
        return "engine"
    if path.suffix == ".json" and path.name.endswith(tuple(s + ".json" for s in ENGINE_SUFFIXES)):
        return "engine"  # the sidecar named directly
    return "checkpoint"


def read(path: Path, kind: str) -> Manifest:
    """The manifest of one artifact, read the way its kind stores it."""
    if kind == "bundle":
        try:
            from vitdeploy.core.bundle_paths import read_bundle_text

            return Manifest.from_json(read_bundle_text(path, "manifest.json"))
        except UnreadableArtifact as e:
            raise UnreadableArtifact(f"{path}: {e}") from None
        except (OSError, ValueError, KeyError) as e:
            raise UnreadableArtifact(f"{path}/manifest.json: not a vitdeploy manifest ({type(e).__name__})") from None
    if kind == "engine":
        from vitdeploy.core.artifact import read_manifest

        return read_manifest(path.with_suffix("") if path.suffix == ".json" else path)
    if kind == "onnx":
        from vitdeploy.core.artifact import read_onnx_manifest

        return read_onnx_manifest(path)
    from vitdeploy.model.importers import read_any_manifest

    return read_any_manifest(path)


def _source_name(m: Manifest) -> str | None:
    name = m.source.get("artifact") or m.source.get("path")
    return str(name) if name else None


def _sha(path: Path) -> str:
    from vitdeploy.core.fileio import source_sha256

    return source_sha256(path)


def lineage(path: Path, m: Manifest) -> list[Link]:
    """The chain from ``path`` back through each recorded source beside it, each link checked (core.lineage)."""
    from vitdeploy.core.lineage import UNRECORDED, source_link

    links: list[Link] = []
    seen = {path.resolve()}
    cur, man = path, m
    for _ in range(MAX_DEPTH):
        lk = source_link(cur, man)
        if lk.status == UNRECORDED or lk.source is None:
            break
        links.append(Link(cur.name, lk.source.name, lk.recorded_sha256, lk.actual_sha256, lk.status))
        src = lk.source
        if lk.actual_sha256 is None or src.resolve() in seen:
            break
        seen.add(src.resolve())
        try:
            man = read(src, kind_of(src))
        except Exception:  # noqa: BLE001 - the chain ends at a source that is not a vitdeploy artifact
            break
        cur = src
    return links


EDITED = "edited"  # a bundle file a user may edit (README, configs, scripts), changed since packing: a warning


def must_match(name: str) -> bool:
    """Whether a bundle file must still be the bytes manifest.json records: every model (``*.onnx``, Triton's copy
    included) and every reference file (``reference/``: the images, inputs and outputs run.py --check judges the
    device against). The rest (README, labels, Triton and DeepStream configs, run.py, build_engine.sh, cpp/) a user
    may edit: a change there is named, not a failure."""
    return name.endswith(".onnx") or name.startswith("reference/")


def bundle_files(folder: Path, m: Manifest) -> list[Link]:
    """Each file a bundle wrote (manifest.json's ``bundle.files``, and its ``artifacts`` for a bundle made before the
    file list existed) against the SHA-256 recorded there: a model or reference file changed or missing is stale or
    missing (``ArtifactInfo.damaged``); any other file changed is edited. Every entry is held to the bundle's own rule
    first (core.bundle_paths: relative, inside, a regular file, bounded): a bundle someone sent is read only inside
    itself."""
    from vitdeploy.core.bundle_paths import bundle_file, bundle_sha256

    raw = m.extra.get("bundle")
    b: dict[str, Any] = raw if isinstance(raw, dict) else {}
    recorded_of: dict[Any, Any] = {}
    for name, rec in (b.get("artifacts") or {}).items():
        recorded_of[name] = rec.get("sha256") if isinstance(rec, dict) else None
    files = b.get("files")
    if isinstance(files, dict):
        for name, sha in files.items():
            recorded_of.setdefault(name, sha if isinstance(sha, str) else None)
            if recorded_of[name] is None and isinstance(sha, str):
                recorded_of[name] = sha
    out = []
    for name, recorded in recorded_of.items():
        f = folder / name if isinstance(name, str) else folder
        if isinstance(name, str) and not f.exists() and not f.is_symlink() and ".." not in name.split("/") \
                and not name.startswith("/"):
            out.append(Link(folder.name, name, recorded, None, "missing" if must_match(name) else EDITED))
            continue
        try:
            bundle_file(folder, name)
            actual = bundle_sha256(folder, name)
        except UnreadableArtifact as e:
            raise UnreadableArtifact(f"{folder}: {e}") from None
        changed = "stale" if must_match(str(name)) else EDITED
        out.append(Link(folder.name, name, recorded, actual,
                        "unrecorded" if not recorded else ("current" if actual == recorded else changed)))
    return out


def info(path: str | Path) -> ArtifactInfo:
    """Read one artifact's manifest and check its lineage (and a bundle's packed files)."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p}: no such file or folder")
    kind = kind_of(p)
    m = read(p, kind)
    res = ArtifactInfo(p, kind, m)
    if kind == "bundle":
        res.files = bundle_files(p, m)
    else:
        res.lineage = lineage(p, m)
    return res


def describe(i: ArtifactInfo) -> list[str]:
    """The human form: one fact per line."""
    m = i.manifest
    pp = m.pp()
    h, w = pp.input_size
    # a label is one field on one line: newlines and controls escaped
    labels = printable_list(m.labels[:10]) + (f", … ({len(m.labels)} in all)" if len(m.labels) > 10 else "")
    task, task_line = _task(m)
    lines = [
        f"{i.path}  ({i.kind}, {m.precision}, target {m.target or 'none (the default graph)'})",
        f"  name           {m.name}",
        f"  task           {task_line}",
        *([] if task is not None and task.is_embedding else [f"  classes        {len(m.labels)}: {labels}"]),
        *_architecture(m),
        f"  input          {h}x{w} RGB, resize {pp.resize_mode}, crop {pp.crop_pct:g}, {pp.interpolation}, "
        f"mean {list(pp.mean)}, std {list(pp.std)}",
    ]
    made = {k: v for k, v in m.source.items() if k not in ("parent",) and v is not None}
    if made:
        lines.append("  made from      " + ", ".join(f"{k} {str(v)[:16] if k == 'sha256' else v}" for k, v in made.items()))
    q = m.extra.get("quantization")
    if isinstance(q, dict):
        lines.append("  quantization   " + ", ".join(f"{k} {v}" for k, v in q.items() if not isinstance(v, (dict, list))))
    eng = m.extra.get("engine")
    if isinstance(eng, dict):
        lines.append(f"  engine         TensorRT {eng.get('tensorrt')}, {eng.get('gpu')}, "
                     f"compute {eng.get('compute_capability')}")
    if i.kind != "bundle":
        if i.lineage:
            lines.append("  lineage        " + "  ←  ".join(
                [i.path.name] + [f"{lk.source} ({lk.state})" for lk in i.lineage]))
        else:
            lines.append("  lineage        none recorded (made from a dataset or imported)")
    arts = (m.extra.get("bundle") or {}).get("artifacts") or {}
    for lk in i.files:  # each model as before; any other file only when it is not as packed
        if lk.source in arts or lk.state not in ("current", "unrecorded"):
            lines.append(f"  packed         {lk.source}: {lk.state}")
    if i.files:
        ok = sum(lk.state == "current" for lk in i.files)
        lines.append(f"  checked        {ok} of {len(i.files)} files as manifest.json records them (SHA-256)")
    for lk in i.lineage:
        if lk.state == "stale":
            lines.append(f"  stale: {lk.source} changed since {lk.artifact} was made from it; re-make it: "
                         f"`{_remake(i.path.parent / lk.artifact)}`")
    for lk in i.files:
        if lk.state == "stale":
            lines.append(f"  stale: {lk.source} changed since the bundle was packed; re-make the bundle")
        elif lk.state == "missing":
            lines.append(f"  missing: {lk.source} is gone since the bundle was packed; re-make the bundle")
        elif lk.state == EDITED:
            lines.append(f"  edited: {lk.source} changed since the bundle was packed (a file you may edit)")
    versions = ", ".join(f"{k} {v}" for k, v in m.versions.items() if not isinstance(v, (dict, list)))
    if versions:
        lines.append(f"  versions       {versions}")
    return lines


def _architecture(m: Manifest) -> list[str]:
    """The model description: its family and what sets it apart from the plain ViT (model.family), and its size."""
    from vitdeploy.model.family import family, features

    cfg = m.model
    if not cfg or "embed_dim" not in cfg:
        return []
    size = f"dim {cfg.get('embed_dim')}, depth {cfg.get('depth')}, heads {cfg.get('num_heads')}, patch {cfg.get('patch_size')}"
    return [f"  family         {family(cfg)} ({size})", f"  features       {'; '.join(features(cfg))}"]


def _remake(artifact: Path) -> str:
    """The one command that re-makes a stale artifact (core.lineage), or a plain hint where it cannot say."""
    from vitdeploy.core.lineage import remake_command

    try:
        return remake_command(artifact, read(artifact, kind_of(artifact)))
    except Exception:  # noqa: BLE001 - a hint only
        return f"re-make {artifact.name} from its source"
