"""`vitdeploy info` shows what an artifact says about itself and checks its lineage against the files beside it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitdeploy.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def chain(mixed_mode_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ckpt.pth -> model.onnx -> model.fp16.onnx in one folder, the cheapest train makes."""
    from vitdeploy.model.train import TrainOptions, train
    from vitdeploy.stages.export import export_onnx
    from vitdeploy.stages.precision import convert_fp16

    d = tmp_path_factory.mktemp("info")
    train(mixed_mode_folder, TrainOptions(epochs=1, out=d / "ckpt.pth", preset="vit-digits", image_size=16, patch_size=4,
                                          batch_size=16))
    export_onnx(d / "ckpt.pth", d / "model.onnx", check=False)
    convert_fp16(d / "model.onnx", d / "model.fp16.onnx", target="trt10")
    return d


def test_info_on_a_checkpoint_shows_labels_preprocessing_and_where_it_came_from(chain: Path) -> None:
    r = runner.invoke(app, ["info", str(chain / "ckpt.pth")])
    assert r.exit_code == 0, r.output
    assert "(checkpoint, fp32, target none" in r.output and "classes        3: class_0, class_1, class_2" in r.output
    assert "input          16x16 RGB" in r.output and "dataset" in r.output


def test_info_on_onnx_walks_the_lineage_and_sees_a_changed_source(chain: Path, tmp_path: Path) -> None:
    for f in ("ckpt.pth", "model.onnx", "model.fp16.onnx"):
        shutil.copy(chain / f, tmp_path / f)
    r = runner.invoke(app, ["info", str(tmp_path / "model.fp16.onnx"), "--json", "-"])
    assert r.exit_code == 0, r.output
    (doc,) = json.loads(r.stdout)
    assert (doc["kind"], doc["precision"], doc["target"]) == ("onnx", "fp16", "trt10")
    assert [(lk["source"], lk["state"]) for lk in doc["lineage"]] == [("model.onnx", "current"), ("ckpt.pth", "current")]
    assert doc["current"] is True and doc["labels"] == ["class_0", "class_1", "class_2"]
    # the checkpoint replaced (a retrain into the same file): the ONNX made from the old one is stale
    with open(tmp_path / "ckpt.pth", "ab") as f:
        f.write(b"retrained")
    r = runner.invoke(app, ["info", str(tmp_path / "model.onnx")])
    assert r.exit_code == 0, r.output
    assert "ckpt.pth (stale)" in r.output and "stale: ckpt.pth changed since model.onnx was made from it; re-make it: `vitdeploy export" in r.output
    (tmp_path / "model.onnx").unlink()
    r = runner.invoke(app, ["info", str(tmp_path / "model.fp16.onnx"), "--json", "-"])
    assert json.loads(r.stdout)[0]["lineage"][0]["state"] == "missing"


def test_info_on_a_bundle_checks_each_packed_file(chain: Path, tmp_path: Path, mixed_mode_folder: Path) -> None:
    from vitdeploy.stages.bundle import BundleOptions, bundle

    out = tmp_path / "b"
    bundle([chain / "model.onnx"], out, BundleOptions(check_images=(mixed_mode_folder,), references=2))
    js = tmp_path / "info.json"
    r = runner.invoke(app, ["info", str(out), "--json", str(js)])
    assert r.exit_code == 0, r.output
    (doc,) = json.loads(js.read_text())
    states = {lk["source"]: lk["state"] for lk in doc["files"]}
    assert doc["kind"] == "bundle" and states and set(states.values()) == {"current"}, states
    packed = next(n for n in states if n.endswith(".onnx") and (out / n).is_file())
    with open(out / packed, "ab") as f:
        f.write(b"edited")
    r = runner.invoke(app, ["info", str(out)])
    assert f"packed         {packed}: stale" in r.output, r.output
