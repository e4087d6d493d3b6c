"""The ONNX artifact: one reader, one unreadable-model message, a manifest read without parsing the graph, one write
that hashes what it wrote; and the names derived from a model's name."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitdeploy.core.artifact import OnnxArtifact, read_manifest, read_onnx_manifest
from vitdeploy.core.errors import UnreadableArtifact, VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.naming import (
    base_stem,
    calib_cache_name,
    engine_name,
    precision_from_name,
    precision_name,
    raw_variant_name,
    sidecar_name,
)


def _manifest(n: int = 10) -> Manifest:
    return Manifest(model={"num_classes": n}, labels=[f"c{i}" for i in range(n)], preprocess={"input_size": [8, 8]},
                    precision="fp32")


def _model(weight_elems: int = 3 * 8 * 8 * 10) -> Any:
    w = numpy_helper.from_array(np.random.default_rng(0).random((3 * 8 * 8, 10), np.float32), "W")
    nodes = [helper.make_node("Flatten", ["pixel_values"], ["f"]), helper.make_node("MatMul", ["f", "W"], ["logits"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_write_hashes_the_bytes_it_wrote_and_reads_back_the_same(tmp_path: Path) -> None:
    art = OnnxArtifact.write(_model(), _manifest(), tmp_path / "model.onnx")
    assert art.sha256 == hashlib.sha256((tmp_path / "model.onnx").read_bytes()).hexdigest()
    back = OnnxArtifact.open(tmp_path / "model.onnx")
    assert back.manifest.labels == _manifest().labels and back.opset == 17
    assert back.input.name == "pixel_values" and back.input.dims == (-1, 3, 8, 8) and back.input.layout == "NCHW"
    assert not back.input.preprocess_in_graph and back.sha256 == art.sha256
    assert read_onnx_manifest(tmp_path / "model.onnx").labels == back.manifest.labels


def test_manifest_and_opset_are_read_without_parsing_the_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    OnnxArtifact.write(_model(), _manifest(), tmp_path / "model.onnx")
    calls: list[str] = []
    real = onnx.load

    def counted(*a: Any, **k: Any) -> Any:
        calls.append("load")
        return real(*a, **k)

    import vitdeploy.core.loaded as loaded

    real_read = loaded.read_hashed

    def counted_read(*a: Any, **k: Any) -> Any:  # OnnxArtifact reads a graph's bytes here (hashed as they are read)
        calls.append("load")
        return real_read(*a, **k)

    monkeypatch.setattr(onnx, "load", counted)
    monkeypatch.setattr(loaded, "read_hashed", counted_read)
    art = OnnxArtifact.open(tmp_path / "model.onnx")
    assert art.manifest.num_classes == 10 and art.opset == 17
    assert calls == [] and not art.loaded  # the graph's bytes were skipped, not parsed
    _ = art.model
    _ = art.model
    assert calls == ["load"]  # and the graph, when asked for, is read once


@pytest.mark.parametrize("content", [b"", b"not a model", None], ids=["empty", "garbage", "truncated"])
def test_an_unreadable_model_is_one_typed_error_with_one_message(tmp_path: Path, content: bytes | None) -> None:
    p = tmp_path / "model.onnx"
    if content is None:
        OnnxArtifact.write(_model(), _manifest(), p)
        content = p.read_bytes()[: len(p.read_bytes()) // 2]
    p.write_bytes(content)
    with pytest.raises(UnreadableArtifact, match="not a readable ONNX model"):
        _ = OnnxArtifact.open(p).manifest
    with pytest.raises(UnreadableArtifact, match="not a readable ONNX model"):
        _ = OnnxArtifact(p).model


def test_a_model_without_a_manifest_is_refused_with_the_export_command(tmp_path: Path) -> None:
    p = tmp_path / "other.onnx"
    onnx.save(_model(), str(p))
    with pytest.raises(UnreadableArtifact, match="without a vitdeploy manifest.*vitdeploy export"):
        _ = OnnxArtifact.open(p).manifest


def test_missing_paths_folders_and_engines_without_sidecars(tmp_path: Path) -> None:
    with pytest.raises(VitdeployError, match="no such ONNX model"):
        OnnxArtifact.open(tmp_path / "model.onnx")
    with pytest.raises(VitdeployError, match="is a folder"):
        OnnxArtifact.open(tmp_path)
    (tmp_path / "m.int8.engine").write_bytes(b"plan")
    with pytest.raises(VitdeployError, match="no sidecar m.int8.engine.json"):
        read_manifest(tmp_path / "m.int8.engine")
    (tmp_path / "m.int8.engine.json").write_text("{broken")
    with pytest.raises(UnreadableArtifact, match="not a readable engine sidecar"):
        read_manifest(tmp_path / "m.int8.engine")


def test_one_naming_module_derives_every_name() -> None:
    m = Path("out/model.onnx")
    assert precision_name(m, "int8") == Path("out/model.int8.onnx")
    assert precision_name(Path("out/model.fp16.onnx"), "int8") == Path("out/model.int8.onnx")
    assert precision_name(Path("out/model.int8.onnx"), "fp32") == m
    assert engine_name(m, "fp32") == Path("out/model.fp32.engine")
    assert engine_name(Path("out/model.int8.onnx"), "int8") == Path("out/model.int8.engine")
    assert sidecar_name(Path("out/model.int8.engine")) == Path("out/model.int8.engine.json")
    assert calib_cache_name(Path("out/model.int8.onnx")) == Path("out/model.int8.calib.json")
    assert raw_variant_name("model.int8.onnx") == "model.int8.raw.onnx"
    assert base_stem("vit.fp16.engine") == "vit" and base_stem("ckpt.pth") == "ckpt"
    assert [precision_from_name(n) for n in ("a.int8.engine", "a.fp16.onnx", "a.onnx")] == ["int8", "fp16", "fp32"]
