"""Preprocessing folded into the graph: the raw-pixel variant answers like the normal pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import export_model_onnx, ort_run, rel_err

from vitdeploy.core.artifact import read_onnx_manifest
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.fileio import sha256_file
from vitdeploy.core.manifest import Manifest, set_onnx_manifest
from vitdeploy.core.preprocess import Preprocess, list_images, preprocess_file, resized_uint8
from vitdeploy.graph.embed import embed_model, raw_batch
from vitdeploy.stages.embed import embed_preprocess, raw_variant_name


def photo_model_onnx(out: Path, channel_order: str = "RGB") -> Path:
    """A small random ViT with ImageNet preprocessing (shorter side, centre crop, bicubic) at 64x64."""
    import torch

    from vitdeploy.model.vit import VisionTransformer, ViTConfig

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=(64, 64), patch_size=16, embed_dim=64, depth=2, num_heads=2, num_classes=7)
    pp = Preprocess(input_size=(64, 64), channel_order=channel_order)
    manifest = Manifest(model=cfg.to_dict(), labels=[f"c{i}" for i in range(7)], preprocess=pp.to_dict(), name="photo")
    return export_model_onnx(VisionTransformer(cfg), out, manifest)


def compare_on_files(normal: Path, raw: Path, files: list[Path]) -> float:
    pp = read_onnx_manifest(normal).pp()
    spec = read_onnx_manifest(raw).extra["input"]
    ref = ort_run(normal, np.stack([preprocess_file(f, pp) for f in files]))
    got = ort_run(raw, raw_batch([resized_uint8(f, pp) for f in files], spec))
    assert (ref.argmax(1) == got.argmax(1)).all()
    return rel_err(got, ref)


def test_raw_variant_matches_normal_pipeline_on_digits(digits_onnx: Path, digits_folder: Path, tmp_path: Path) -> None:
    raw = embed_preprocess(digits_onnx, tmp_path / "model.raw.onnx")
    files = list_images(digits_folder / "val")[::6]
    assert len(files) >= 50
    assert compare_on_files(digits_onnx, raw, files) <= 1e-4
    m = onnx.load(str(raw))
    (inp,) = m.graph.input
    assert inp.name == "images" and inp.type.tensor_type.elem_type == onnx.TensorProto.UINT8
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert dims == ["batch", 32, 32, 3]
    man = read_onnx_manifest(raw)
    assert man.extra["input"]["layout"] == "NHWC" and man.extra["input"]["dtype"] == "uint8"
    assert man.source == {"artifact": "model.onnx", "sha256": sha256_file(digits_onnx), "kind": "onnx"}
    assert man.labels == read_onnx_manifest(digits_onnx).labels


@pytest.mark.parametrize("order", ["RGB", "BGR"])
def test_raw_variant_matches_on_photos_with_imagenet_preprocessing(photo_files: list[Path], tmp_path: Path, order: str) -> None:
    normal = photo_model_onnx(tmp_path / "model.onnx", order)
    raw = embed_preprocess(normal)
    assert raw.name == "model.raw.onnx"
    assert compare_on_files(normal, raw, photo_files) <= 1e-4


def test_bgr_graph_differs_from_rgb_graph(photo_files: list[Path], tmp_path: Path) -> None:
    # the channel reorder is really in the graph: the same pixels through a BGR model's variant and
    # through the RGB normal pipeline disagree
    rgb = photo_model_onnx(tmp_path / "rgb.onnx", "RGB")
    bgr_raw = embed_preprocess(photo_model_onnx(tmp_path / "bgr.onnx", "BGR"))
    pp = read_onnx_manifest(rgb).pp()
    x = raw_batch([resized_uint8(f, pp) for f in photo_files], {"layout": "NHWC"})
    ref = ort_run(rgb, np.stack([preprocess_file(f, pp) for f in photo_files]))
    assert rel_err(ort_run(bgr_raw, x), ref) > 1e-3


def test_fp16_and_qdq_int8_variants(digits_onnx: Path, digits_folder: Path, tmp_path: Path) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.transformers.float16 import convert_float_to_float16

    man = read_onnx_manifest(digits_onnx)
    pp = man.pp()
    files = list_images(digits_folder / "val")[::12]
    x = np.stack([preprocess_file(f, pp) for f in files])

    fp16 = tmp_path / "model.fp16.onnx"
    m16 = convert_float_to_float16(onnx.load(str(digits_onnx)), keep_io_types=False)
    set_onnx_manifest(m16, man.derive(precision="fp16"))
    onnx.save(m16, str(fp16))

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"pixel_values": x[i : i + 8]} for i in range(0, len(x), 8)])

        def get_next(self):  # noqa: ANN201
            return next(self.it, None)

    int8 = tmp_path / "model.int8.onnx"
    quantize_static(str(digits_onnx), str(int8), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True)
    m8 = onnx.load(str(int8))
    assert any(n.op_type == "QuantizeLinear" for n in m8.graph.node)
    set_onnx_manifest(m8, man.derive(precision="int8"))
    onnx.save(m8, str(int8))

    for path, tol in ((fp16, 1e-3), (int8, 1e-4)):
        raw = embed_preprocess(path)
        assert raw.name == raw_variant_name(path.name)
        assert read_onnx_manifest(raw).precision == read_onnx_manifest(path).precision
        x_in = x.astype(np.float16) if path == fp16 else x
        ref = ort_run(path, x_in)
        got = ort_run(raw, raw_batch([resized_uint8(f, pp) for f in files], {"layout": "NHWC"}))
        assert rel_err(got, ref) <= tol, path.name
        assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.97


def test_deepstream_form_float_nchw_with_softmax(digits_onnx: Path, digits_folder: Path, tmp_path: Path) -> None:
    out = embed_preprocess(digits_onnx, tmp_path / "ds.onnx", dtype="float32", layout="nchw", softmax=True)
    man = read_onnx_manifest(out)
    assert man.extra["input"]["layout"] == "NCHW" and man.extra["output"] == {"name": "probs", "kind": "probs"}
    pp = man.pp()
    files = list_images(digits_folder / "val")[:20]
    logits = ort_run(digits_onnx, np.stack([preprocess_file(f, pp) for f in files]))
    probs = ort_run(out, raw_batch([resized_uint8(f, pp) for f in files], man.extra["input"]))
    e = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(probs, e / e.sum(1, keepdims=True), atol=1e-5)


def test_refuses_to_embed_twice_or_overwrite(digits_onnx: Path, tmp_path: Path) -> None:
    raw = embed_preprocess(digits_onnx, tmp_path / "model.raw.onnx")
    with pytest.raises(VitdeployError, match="already in this graph"):
        embed_preprocess(raw, tmp_path / "again.onnx")
    with pytest.raises(VitdeployError, match="overwrite its source"):
        embed_preprocess(digits_onnx, digits_onnx)
    before = sha256_file(raw)
    with pytest.raises(VitdeployError):
        embed_preprocess(digits_onnx, raw, dtype="int16")
    assert sha256_file(raw) == before  # a failed call leaves the good file as it was


def test_input_shape_must_match_manifest(digits_onnx: Path) -> None:
    m = onnx.load(str(digits_onnx))
    with pytest.raises(VitdeployError, match=r"expected \[batch, 3, 48, 48\]"):
        embed_model(m, Preprocess(input_size=(48, 48)))


def test_cli_export_embed_preprocess(digits_ckpt: Path, digits_folder: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from vitdeploy.cli import app

    out = tmp_path / "model.onnx"
    r = CliRunner().invoke(app, ["export", str(digits_ckpt), "-o", str(out), "--no-check", "--embed-preprocess"])
    assert r.exit_code == 0, r.output
    raw = tmp_path / "model.raw.onnx"
    assert raw.is_file() and "model.raw.onnx" in r.output and "[batch, H, W, 3]" in r.output
    assert read_onnx_manifest(out).extra["raw_variant"] == "model.raw.onnx"  # the export names its variant
    man = read_onnx_manifest(raw)
    assert man.source["sha256"] == sha256_file(out) and "raw_variant" not in man.extra
    assert compare_on_files(out, raw, list_images(digits_folder / "val")[:40]) <= 1e-4


def test_variants_of_vitdeploys_own_precision_artifacts(digits_onnx: Path, digits_fp16: Path, digits_folder: Path,
                                                        tmp_path: Path, copy_artifact) -> None:
    # vitdeploy.stages.precision's FP16 (float32 I/O, float32 islands; its Casts come last in the node list) and its
    # Q/DQ INT8 with FP16 for the unquantized parts, as built for TensorRT
    from vitdeploy.stages.precision import calibrate

    fp16 = copy_artifact(digits_fp16)  # its raw variant is written beside it
    int8 = calibrate(digits_onnx, digits_folder / "train", tmp_path / "model.int8.onnx", num_images=64, float_type="fp16").path
    files = list_images(digits_folder / "val")[::10]
    for path in (fp16, int8):
        assert compare_on_files(path, embed_preprocess(path), files) <= 1e-3, path.name


def test_runner_refuses_raw_variant_with_one_line(digits_onnx: Path, digits_folder: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from vitdeploy.cli import app
    from vitdeploy.runners import open_runner

    raw = embed_preprocess(digits_onnx, tmp_path / "model.raw.onnx")
    with pytest.raises(VitdeployError, match="preprocessing folded into the graph"):
        open_runner(raw)
    res = CliRunner().invoke(app, ["infer", str(digits_folder / "val" / "3"), "--model", str(raw)])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "preprocessing folded into the graph" in res.stderr
