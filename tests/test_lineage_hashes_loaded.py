"""Lineage hashes the bytes a command loaded, not the file as it lies there after the work (issue 31, item 3).

A checkpoint replaced during an export (a training run renaming its .partial, a copy from another terminal) must not
give a model.onnx of the old weights whose lineage names the new file: the command refuses in one line and writes
nothing, and `bundle ckpt.pth` then never reuses an ONNX of the old weights as current."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.fileio import sha256_file


def other_weights(ckpt: Path, dest: Path) -> Path:
    """The same checkpoint with other weights (as more training would give), saved the way train saves it."""
    import torch

    from vitdeploy.model.checkpoint import load_checkpoint, save_checkpoint

    ck = load_checkpoint(ckpt)
    model = ck.build()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.25)
    return save_checkpoint(dest, model, ck.manifest)


def torch_logits(ckpt: Path, x: np.ndarray) -> np.ndarray:
    import torch

    from vitdeploy.model.checkpoint import load_model

    model, _ = load_model(ckpt)
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def onnx_logits(path: Path, x: np.ndarray) -> np.ndarray:
    from vitdeploy.runners.onnxruntime import OnnxRuntimeRunner

    return OnnxRuntimeRunner(path).run(x)


def test_a_checkpoint_replaced_during_export_writes_nothing_and_bundle_re_exports(
        digits_ckpt: Path, digits_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vitdeploy.stages.export as stage
    from vitdeploy.stages.prepare import prepare

    work = tmp_path / "work"
    work.mkdir()
    ckpt, onnx_path = work / "ckpt.pth", work / "model.onnx"
    shutil.copy(digits_ckpt, ckpt)
    shutil.copy(digits_onnx, onnx_path)  # exported from this ckpt.pth: current
    before = onnx_path.read_bytes()
    newer = other_weights(ckpt, tmp_path / "ckpt.pth.partial")
    real = stage._torch_export

    def renamed_over_it_meanwhile(*a: object, **kw: object) -> object:  # after the checkpoint was read
        os.replace(newer, ckpt)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(stage, "_torch_export", renamed_over_it_meanwhile)
    try:  # either refused in one line with nothing written, or the lineage names the bytes converted
        stage.export_onnx(ckpt, onnx_path, check=False)
    except VitdeployError as e:
        assert "ckpt.pth changed while export ran" in str(e) and "\n" not in str(e)
        assert onnx_path.read_bytes() == before  # nothing written
    assert not [p for p in work.iterdir() if p.name.startswith(".model.onnx")]
    monkeypatch.undo()

    # bundle's one command from the checkpoint: the earlier model.onnx is stale, so it is exported again, and what
    # it packs answers like the checkpoint as it is now
    x = np.random.default_rng(0).standard_normal((4, 3, *OnnxArtifact.open(onnx_path).manifest.input_size),
                                                 dtype=np.float32)
    prep = prepare(ckpt, None, int8=False, fp16=False)
    assert prep.models == [onnx_path] and "model.onnx" in prep.made
    assert OnnxArtifact.open(onnx_path).manifest.source["sha256"] == sha256_file(ckpt)
    np.testing.assert_allclose(onnx_logits(onnx_path, x), torch_logits(ckpt, x), rtol=1e-3, atol=1e-3)


def test_export_records_the_sha256_of_the_bytes_it_converted(digits_ckpt: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded SHA-256 comes from the load itself: a checkpoint rewritten in place after being read (same
    inode) is refused too, and an undisturbed export records exactly the bytes it read."""
    import vitdeploy.stages.export as stage

    ckpt = tmp_path / "ckpt.pth"
    shutil.copy(digits_ckpt, ckpt)
    res = stage.export_onnx(ckpt, tmp_path / "model.onnx", check=False)
    assert res.manifest.source["sha256"] == sha256_file(ckpt)
    old_sha = sha256_file(ckpt)
    newer = other_weights(ckpt, tmp_path / "newer.pth").read_bytes()
    real = stage._torch_export

    def copied_over_it(*a: object, **kw: object) -> object:  # `cp newer.pth ckpt.pth` in another terminal
        with open(ckpt, "r+b") as f:
            f.write(newer)
            f.truncate()
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(stage, "_torch_export", copied_over_it)
    again = tmp_path / "again.onnx"
    try:
        stage.export_onnx(ckpt, again, check=False)
    except VitdeployError as e:
        assert "ckpt.pth changed while export ran" in str(e)
        assert not again.exists()
    else:  # written: then its lineage must name the bytes it converted (the earlier checkpoint), never the new one
        assert OnnxArtifact.open(again).manifest.source["sha256"] == old_sha != sha256_file(ckpt)


def test_an_onnx_model_replaced_during_convert_fp16_writes_nothing(digits_onnx: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx
    from onnx import numpy_helper

    import vitdeploy.stages.precision as stage

    src = tmp_path / "model.onnx"
    shutil.copy(digits_onnx, src)
    m = onnx.load(str(src))
    init = max(m.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    onnx.save(m, str(tmp_path / "next.onnx"))
    real = stage._fit_graph

    def re_exported_meanwhile(*a: object, **kw: object) -> None:  # after model.onnx was read
        os.replace(tmp_path / "next.onnx", src)
        real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(stage, "_fit_graph", re_exported_meanwhile)
    with pytest.raises(VitdeployError) as e:
        stage.convert_fp16(src, tmp_path / "model.fp16.onnx")
    assert "model.onnx changed while convert-fp16 ran" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "model.fp16.onnx").exists()


def test_an_onnx_model_hashed_then_changed_before_it_is_read_is_refused(digits_onnx: Path, tmp_path: Path) -> None:
    """One artifact, one version: a SHA-256 taken before the graph was read must be of the bytes then read."""
    import onnx

    src = tmp_path / "model.onnx"
    shutil.copy(digits_onnx, src)
    art = OnnxArtifact.open(src)
    first = art.sha256
    m = onnx.load(str(src))
    m.doc_string = "re-exported"
    onnx.save(m, str(src))
    with pytest.raises(VitdeployError, match="changed"):
        art.model  # noqa: B018 - reading the graph is the act under test
    fresh = OnnxArtifact.open(src)
    fresh.model  # noqa: B018
    assert fresh.sha256 == sha256_file(src) != first


def test_import_records_the_bytes_it_converted_or_refuses(digits_ckpt: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`import` (any checkpoint -> a vitdeploy checkpoint) records its source's SHA-256: of the bytes it loaded."""
    from vitdeploy.model import checkpoint
    from vitdeploy.model.importers import import_checkpoint

    src = tmp_path / "trained.pth"
    shutil.copy(digits_ckpt, src)
    loaded_sha = sha256_file(src)
    newer = other_weights(src, tmp_path / "newer.pth")
    real = checkpoint.Checkpoint.build

    def renamed_over_it_meanwhile(self: checkpoint.Checkpoint) -> object:  # after the source was read
        os.replace(newer, src)
        return real(self)

    monkeypatch.setattr(checkpoint.Checkpoint, "build", renamed_over_it_meanwhile)
    out = tmp_path / "ckpt.pth"
    try:
        _, manifest = import_checkpoint(src, out)
    except VitdeployError as e:
        assert "trained.pth changed while import ran" in str(e) and not out.exists()
    else:
        assert manifest.source["sha256"] == loaded_sha != sha256_file(src)


def test_an_onnx_model_replaced_during_calibrate_writes_nothing(digits_onnx: Path, digits_folder: Path,
                                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx
    from onnx import numpy_helper

    import vitdeploy.stages.precision as stage

    src = tmp_path / "model.onnx"
    shutil.copy(digits_onnx, src)
    m = onnx.load(str(src))
    init = max(m.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    onnx.save(m, str(tmp_path / "next.onnx"))
    real = stage._collect_ranges

    def re_exported_meanwhile(*a: object, **kw: object) -> object:  # after model.onnx was read
        if (tmp_path / "next.onnx").exists():
            os.replace(tmp_path / "next.onnx", src)
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(stage, "_collect_ranges", re_exported_meanwhile)
    with pytest.raises(VitdeployError) as e:
        stage.calibrate(src, digits_folder / "val", tmp_path / "model.int8.onnx", num_images=8, batch_size=4)
    assert "model.onnx changed while calibrate ran" in str(e.value) and "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]  # no model, no calibration cache
