"""An ONNX artifact: one object per model file, read once per command (Polygraphy's loaders, Optimum's OnnxConfig).

Every stage takes an ``OnnxArtifact`` and returns one. It is the one reader of ONNX files in vitdeploy and the one
place that says a file is not a readable model. What it knows is read lazily and kept:

* ``manifest`` — without parsing the graph when the model is not loaded (``open_manifest``: the protobuf is scanned
  for its ``metadata_props`` and ``opset_import`` fields and the graph's bytes are skipped, so a 300 MB model gives
  its manifest in milliseconds; onnx has no partial parse, hence the scanner);
* ``model`` — the ``onnx.ModelProto`` (tensors kept in external data stay on disk until ``load_weights``);
* ``opset``, ``input`` (the I/O contract: name, dims, dtype, layout, whether the preprocessing is in the graph) and
  ``sha256`` (cached; the bytes written are hashed as they are written, the bytes read as they are read: a derived
  artifact's lineage names the bytes it was made from, core/loaded.py).
"""

from __future__ import annotations

import hashlib
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitdeploy.core import loaded
from vitdeploy.core.errors import SourceChanged, UnreadableArtifact, VitdeployError
from vitdeploy.core.fileio import atomic_path, sha256_file
from vitdeploy.core.loaded import changed_message
from vitdeploy.core.manifest import ONNX_KEY, Manifest, set_onnx_manifest, sidecar_path
from vitdeploy.core.naming import ENGINE_SUFFIXES

# The ONNX I/O contract vitdeploy writes (export) and every reader expects.
INPUT_NAME = "pixel_values"
OUTPUT_NAME = "logits"
BATCH_DIM = "batch"

# ModelProto field numbers (onnx/onnx.proto3): what the manifest-only scan keeps.
_OPSET_IMPORT = 8
_METADATA_PROPS = 14


@dataclass(frozen=True)
class InputContract:
    """The model's one image input as its graph declares it."""

    name: str
    dims: tuple[int, ...]  # -1 for the symbolic batch; a symbolic H, W is the manifest's size
    dtype: str  # "float32", "float16" or "uint8"
    layout: str  # "NCHW" (normal export) or "NHWC" (preprocessing folded into the graph)
    preprocess_in_graph: bool

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dims": list(self.dims), "dtype": self.dtype, "layout": self.layout,
                "preprocess_in_graph": self.preprocess_in_graph}


def unreadable(path: str | Path, why: str) -> UnreadableArtifact:
    """The one message for a model file that cannot be read (every reader of ONNX files goes through here)."""
    return UnreadableArtifact(f"{path}: not a readable ONNX model ({why}); re-export it")


def _varint(buf: Any, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def scan_fields(buf: Any, keep: tuple[int, ...]) -> bytes:
    """The wire bytes of the top-level fields numbered ``keep`` (everything else skipped unparsed)."""
    out = bytearray()
    i, n = 0, len(buf)
    while i < n:
        start = i
        tag, i = _varint(buf, i)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            _, i = _varint(buf, i)
        elif wire == 1:
            i += 8
        elif wire == 2:
            size, i = _varint(buf, i)
            i += size
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wire}")
        if i > n or field == 0:
            raise ValueError("truncated field")
        if field in keep:
            out += buf[start:i]
    return bytes(out)


class OnnxArtifact:
    """One ONNX model file and what vitdeploy knows of it (see the module docstring)."""

    def __init__(self, path: str | Path, model: Any = None, manifest: Manifest | None = None,
                 sha256: str | None = None) -> None:
        self.path = Path(path)
        self._model = model
        self._manifest = manifest
        self._sha256 = sha256
        self._header: Any = None  # ModelProto with metadata_props and opset_import only
        self._key: Any = None  # the file's identity when its graph was read (core.loaded.stat_key)

    # --- opening -------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path) -> OnnxArtifact:
        """An artifact for ``path``; nothing is read until asked, but a missing path or a folder is refused now."""
        p = Path(path)
        if p.is_dir():
            raise VitdeployError(f"{p} is a folder: pass the ONNX model file (e.g. {p}/model.onnx)")
        if not p.is_file():
            hint = " (run `vitdeploy export ckpt.pth` first)" if p.name == "model.onnx" else ""
            raise VitdeployError(f"{p}: no such ONNX model{hint}")
        return cls(p)

    @classmethod
    def open_manifest(cls, path: str | Path) -> Manifest:
        """Only the manifest, without parsing the graph."""
        return cls.open(path).manifest

    def _read_header(self) -> Any:
        if self._header is None:
            import onnx

            try:
                with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                    head = scan_fields(buf, (_OPSET_IMPORT, _METADATA_PROPS))
                self._header = onnx.ModelProto.FromString(head)
            except (ValueError, OSError, Exception) as e:
                raise unreadable(self.path, type(e).__name__) from None
        return self._header

    # --- what it knows -------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def model(self) -> Any:
        """The ModelProto, read on first use (external data left on disk)."""
        if self._model is None:
            import onnx

            try:
                data, digest = loaded.read_hashed(self.path)  # read once: the SHA-256 is of the bytes parsed
                model = onnx.load_model_from_string(data)
            except SourceChanged:
                raise
            except Exception as e:
                raise unreadable(self.path, type(e).__name__) from None
            del data
            if not model.graph.node:  # protobuf reads an empty file as an empty model
                raise unreadable(self.path, "no graph")
            if self._sha256 is not None and self._sha256 != digest:  # hashed earlier, changed before it was loaded
                raise SourceChanged(changed_message(self.path, "this command"))
            self._model = model
            self._sha256 = digest
            self._key = self._read_key()
        return self._model

    def _read_key(self) -> Any:
        from vitdeploy.core.loaded import stat_key

        try:
            return stat_key(self.path.stat())
        except OSError:
            return None

    def require_unchanged(self, what: str = "") -> None:
        """Refuse (SourceChanged, one line) when the file was replaced or rewritten since its graph was read here:
        a stage calls it just before writing what it made from it, so no result's lineage names bytes it was not
        made from."""
        if self._model is not None and self._key is not None and self._read_key() != self._key:
            raise SourceChanged(changed_message(self.path, what))

    def load_weights(self) -> Any:
        """The model with every tensor stored as external data read in (for a stage that rewrites weights)."""
        from onnx.external_data_helper import load_external_data_for_model, uses_external_data

        model = self.model
        if any(uses_external_data(t) for t in model.graph.initializer):
            try:
                load_external_data_for_model(model, str(self.path.parent))
            except Exception as e:
                raise unreadable(self.path, f"its external data: {type(e).__name__}") from None
        return model

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            props = self._model.metadata_props if self._model is not None else self._read_header().metadata_props
            for p in props:
                if p.key == ONNX_KEY:
                    try:
                        self._manifest = Manifest.from_json(p.value)
                    except (ValueError, KeyError, TypeError) as e:
                        raise UnreadableArtifact(f"{self.path}: its vitdeploy manifest is damaged ({type(e).__name__}); "
                                                 "re-export it with `vitdeploy export`") from None
                    break
            else:
                raise UnreadableArtifact(
                    f"{self.path}: an ONNX model without a vitdeploy manifest; export it with `vitdeploy export`")
        return self._manifest

    @property
    def opset(self) -> int:
        src = self._model if self._model is not None else self._read_header()
        for o in src.opset_import:
            if o.domain in ("", "ai.onnx"):
                return int(o.version)
        return 0

    @property
    def input(self) -> InputContract:
        """The one image input (refused when the graph has another number of inputs)."""
        model = self.model
        inits = {i.name for i in model.graph.initializer}
        inputs = [i for i in model.graph.input if i.name not in inits]
        if len(inputs) != 1:
            raise UnreadableArtifact(
                f"{self.path}: expected one image input, found {len(inputs)}; re-export it with `vitdeploy export`")
        inp = inputs[0]
        tt = inp.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        dtype = {1: "float32", 10: "float16", 2: "uint8"}.get(tt.elem_type, str(tt.elem_type))
        nhwc = len(dims) == 4 and dims[-1] == 3 and dims[1] != 3
        in_graph = bool((self.manifest.extra.get("input") or {}).get("preprocess_in_graph")) or dtype == "uint8"
        if len(dims) == 4 and not nhwc and dims[1] in (-1, 3) and -1 in dims[2:]:
            h, w = self.manifest.input_size
            dims = [dims[0], 3, h, w]
        return InputContract(inp.name, tuple(dims), dtype, "NHWC" if nhwc else "NCHW", in_graph)

    @property
    def sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = sha256_file(self.path)
        return self._sha256

    @property
    def precision(self) -> str:
        return self.manifest.precision

    def source_record(self) -> dict[str, Any]:
        """What a derived artifact records of this one (its lineage link)."""
        return {"artifact": self.path.name, "sha256": self.sha256}

    def __repr__(self) -> str:
        return f"OnnxArtifact({str(self.path)!r})"

    # --- writing -------------------------------------------------------------------------------

    @classmethod
    def write(cls, model: Any, manifest: Manifest, path: str | Path) -> OnnxArtifact:
        """Store ``manifest`` in ``model``, serialise it once, write it atomically and hash the bytes written."""
        set_onnx_manifest(model, manifest)
        data = model.SerializeToString()
        out = Path(path)
        with atomic_path(out) as tmp:
            tmp.write_bytes(data)
        art = cls(out, model=model, manifest=manifest, sha256=hashlib.sha256(data).hexdigest())
        art._key = art._read_key()  # the file as written: require_unchanged knows a later re-write
        return art


def read_onnx_manifest(path: str | Path) -> Manifest:
    """The manifest of an ONNX file, without parsing its graph."""
    return OnnxArtifact.open_manifest(path)


def manifest_from_onnx(model: Any, path: str | Path) -> Manifest:
    """The manifest of an onnx.ModelProto already in memory (``path`` names it in the error)."""
    return OnnxArtifact(path, model=model).manifest


def read_manifest(path: str | Path) -> Manifest:
    """The manifest of an ONNX model or an engine (its sidecar); checkpoints are read by the model layer."""
    p = Path(path)
    if not p.exists():
        raise VitdeployError(f"{p}: no such file or folder")
    if p.suffix == ".onnx":
        return read_onnx_manifest(p)
    if p.suffix in ENGINE_SUFFIXES:
        side = sidecar_path(p)
        if not side.exists():
            raise VitdeployError(f"{p}: no sidecar {side.name} beside the engine; rebuild it with `vitdeploy build-engine`")
        try:
            return Manifest.from_json(side.read_text())
        except (ValueError, KeyError, TypeError) as e:
            raise UnreadableArtifact(f"{side}: not a readable engine sidecar ({type(e).__name__}); rebuild the engine "
                                     "with `vitdeploy build-engine`") from None
    raise VitdeployError(f"{p}: not an ONNX model or engine (for a checkpoint, use model.importers.read_any_manifest)")
