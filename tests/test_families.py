"""Every ViT family downstream: a digits ViT of each (tests/families.py), trained a few epochs by train --init's code,
goes through `vitdeploy bundle CKPT -t jetpack6.1 -i DIR`, whose INT8 and FP16 models must pass check-target for trt10
and agree >= 98% with FP32 on the TensorRT oracle; then info names its family, and explain draws a map of the patches
only, saying how it was made."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import artifact_cache
import numpy as np
import pytest
from families import FAMILIES
from typer.testing import CliRunner

from vitdeploy.checks import conformance as cf
from vitdeploy.cli import app

MIN_AGREEMENT = 0.98  # the bar: INT8 and FP16 answer like FP32 on >= 98% of the images, on the oracle


def _ckpt(name: str, tmp_path: Path) -> Path:
    work = tmp_path / name
    work.mkdir()
    shutil.copy2(artifact_cache.family_ckpt_entry(name, FAMILIES[name]) / "ckpt.pth", work / "ckpt.pth")
    return work / "ckpt.pth"


def _receipt(output: str) -> dict[str, dict[str, float]]:
    """The receipt table's rows: artifact → top-1 and agreement (fractions)."""
    rows: dict[str, dict[str, float]] = {}
    for line in output.splitlines():
        m = re.match(r"\W*(model[\w.]*\.onnx)\W+(\S+)\W+([\d.]+)%.*?(?:([\d.]+)%)?\s*│\s*[\d.]+ MB", line)
        if m:
            rows[m.group(1)] = {"top1": float(m.group(3)) / 100,
                                "agreement": float(m.group(4)) / 100 if m.group(4) else 1.0}
    return rows


@pytest.mark.parametrize("name", list(FAMILIES))
def test_bundle_of_each_family_passes_trt10_and_agrees_with_fp32_on_the_oracle(name: str, digits_val10: Path,
                                                                                tmp_path: Path) -> None:
    ckpt = _ckpt(name, tmp_path)
    r = CliRunner().invoke(app, ["bundle", str(ckpt), "-t", "jetpack6.1", "-i", str(digits_val10),
                                 "-o", str(ckpt.parent / "b"), "--references", "4", "--opt-batch", "2",
                                 "--max-batch", "4"], terminal_width=240)
    assert r.exit_code == 0, r.output
    rows = _receipt(r.output)
    assert {"model.onnx", "model.int8.onnx", "model.fp16.onnx"} <= set(rows), r.output
    print(f"{name}: FP32 top-1 {rows['model.onnx']['top1']:.4f}; oracle agreement with FP32: "
          f"INT8 {rows['model.int8.onnx']['agreement']:.4f}, FP16 {rows['model.fp16.onnx']['agreement']:.4f}")
    for art in ("model.int8.onnx", "model.fp16.onnx"):
        assert rows[art]["agreement"] >= MIN_AGREEMENT, (name, art, rows[art])
        path = ckpt.parent / art
        found = cf.check_onnx(path, "trt10").findings + cf.check_int8_intent(path, "trt10").findings
        assert not found, [f.line() for f in found]
    for art in ("model.onnx", "model.int8.onnx", "model.fp16.onnx"):
        assert not cf.check_onnx(ckpt.parent / art, "trt10").findings


@pytest.mark.parametrize("name", list(FAMILIES))
def test_info_names_the_family_and_explain_maps_only_the_patches(name: str, digits_folder: Path, tmp_path: Path) -> None:
    from vitdeploy.model.family import family, features, token_layout
    from vitdeploy.tools.explain import explain

    ckpt = _ckpt(name, tmp_path)
    r = CliRunner().invoke(app, ["info", str(ckpt), "--json", "-"])
    assert r.exit_code == 0, r.output
    (d,) = json.loads(r.stdout)
    from vitdeploy.model.importers import read_any_manifest

    cfg = read_any_manifest(ckpt).model
    assert d["family"] == family(cfg) and d["features"] == features(cfg) and d["family"] != "ViT"
    r = CliRunner().invoke(app, ["info", str(ckpt)], terminal_width=240)
    assert r.exit_code == 0 and f"family         {family(cfg)}" in r.output
    images = sorted((digits_folder / "val" / "3").iterdir())[:2]
    res = explain(images, ckpt, tmp_path / "maps")
    lay = token_layout(cfg)
    for ex in res.explanations:
        assert ex.heatmap.shape == (8, 8) and ex.heatmap.max() == 1.0
    if lay.registers:
        assert f"{lay.registers} register tokens left out of the map" in res.note
    if lay.distilled:
        assert "distillation token left out of the map" in res.note
    assert res.note.startswith("map from")
    assert np.isfinite(np.stack([e.heatmap for e in res.explanations])).all()
