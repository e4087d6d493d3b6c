"""Lineage: a derived artifact's recorded source against the file beside it; a stale one is refused with the command
that re-makes it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from vitdeploy.core.errors import StaleArtifact
from vitdeploy.core.lineage import CURRENT, MISSING, STALE, UNRECORDED, remake_command, require_current, source_link
from vitdeploy.core.manifest import Manifest


def _derived(src: Path, precision: str, target: str | None = None) -> Manifest:
    return Manifest(model={"num_classes": 2}, labels=["a", "b"], preprocess={"input_size": [8, 8]}, precision=precision,
                    target=target, source={"artifact": src.name, "sha256": hashlib.sha256(src.read_bytes()).hexdigest()})


def test_current_then_stale_then_missing(tmp_path: Path) -> None:
    fp32 = tmp_path / "model.onnx"
    fp32.write_bytes(b"first export")
    man = _derived(fp32, "int8")
    q = tmp_path / "model.int8.onnx"
    assert source_link(q, man).status == CURRENT
    require_current(q, man)
    fp32.write_bytes(b"second export, from a retrained checkpoint")
    link = source_link(q, man)
    assert link.status == STALE and link.actual_sha256 != link.recorded_sha256
    with pytest.raises(StaleArtifact, match=r"model.int8.onnx is stale: .*`vitdeploy calibrate .*model.onnx`"):
        require_current(q, man)
    fp32.unlink()
    assert source_link(q, man).status == MISSING
    require_current(q, man)  # nothing to compare against: not called stale
    bare = Manifest(model={"num_classes": 2}, labels=["a", "b"], preprocess={"input_size": [8, 8]})
    assert source_link(q, bare).status == UNRECORDED


def test_the_remake_command_keeps_precision_and_target(tmp_path: Path) -> None:
    fp32 = tmp_path / "model.onnx"
    fp32.write_bytes(b"x")
    assert remake_command(tmp_path / "model.fp16.onnx", _derived(fp32, "fp16", "trt8.5")) == \
        f"vitdeploy convert-fp16 {fp32} --target trt8.5"
    ckpt = tmp_path / "ckpt.pth"
    ckpt.write_bytes(b"weights")
    m = Manifest(model={"num_classes": 2}, labels=["a", "b"], preprocess={"input_size": [8, 8]},
                 source={"kind": "checkpoint", "path": "ckpt.pth", "sha256": "0" * 64})
    assert remake_command(fp32, m) == f"vitdeploy export {ckpt}"
    assert source_link(fp32, m).status == STALE


def test_verify_names_a_candidate_made_from_an_earlier_reference(digits_artifacts: Path, tmp_path: Path) -> None:
    """verify of model.int8.onnx against a re-exported model.onnx says the candidate is stale and how to re-make it."""
    import shutil

    import onnx

    from vitdeploy.checks.verify import verify
    from vitdeploy.model.data import write_digits

    for name in ("model.onnx", "model.int8.onnx"):
        shutil.copy(digits_artifacts / name, tmp_path / name)
    m = onnx.load(str(tmp_path / "model.onnx"))
    m.doc_string = "exported again"  # the same weights, another file: what a re-export after retraining looks like
    onnx.save(m, str(tmp_path / "model.onnx"))
    write_digits(tmp_path / "digits")
    report = verify(tmp_path / "model.onnx", [tmp_path / "model.int8.onnx"], tmp_path / "digits" / "val", backend="onnxruntime")
    stale = [n for n in report.notes if "is stale" in n]
    assert stale and "vitdeploy calibrate" in stale[0] and "model.int8.onnx" in stale[0]
