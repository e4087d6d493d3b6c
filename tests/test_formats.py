"""Files users already hold keep loading: the on-disk keys are written here literally, not via the constants."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from vitdeploy.core.artifact import read_onnx_manifest
from vitdeploy.model.importers import load_any, read_any_manifest
from vitdeploy.model.vit import VisionTransformer, get_preset


def _manifest_json(preset: str = "vit-digits") -> str:
    p = get_preset(preset)
    return json.dumps({
        "format": "vitdeploy-manifest/1", "name": preset, "precision": "fp32",
        "model": p.config.to_dict(), "labels": [str(i) for i in range(p.config.num_classes)],
        "preprocess": dict(p.preprocess),
    })


def test_onnx_with_the_manifest_key_loads(tmp_path: Path) -> None:
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.metadata_props.add(key="vitdeploy.manifest", value=_manifest_json())
    path = tmp_path / "old.onnx"
    onnx.save(m, str(path))
    man = read_onnx_manifest(path)
    assert man.name == "vit-digits" and man.num_classes == 10 and man.input_size == (32, 32)


def test_checkpoint_with_the_manifest_key_loads(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = VisionTransformer(get_preset("vit-digits").config).eval()
    path = tmp_path / "old.pth"
    torch.save({"vitdeploy_manifest": _manifest_json(), "state_dict": model.state_dict()}, path)
    ck = load_any(path)
    assert ck.manifest.name == "vit-digits" and read_any_manifest(path).num_classes == 10
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))
    with torch.inference_mode():
        assert torch.equal(ck.build()(x), model(x))
