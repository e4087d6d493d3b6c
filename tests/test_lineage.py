"""Lineage: a derived artifact's recorded source against the file beside it; a stale one is refused with the command
that re-makes it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from vitdeploy.core.artifact import read_manifest
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


def _onnx_with(path: Path, source: dict[str, object]) -> str:
    """A one-node ONNX model carrying a manifest whose ``source`` is ``source``; its SHA-256."""
    import onnx
    from onnx import TensorProto, helper

    from vitdeploy.core.manifest import set_onnx_manifest

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], path.name, [x], [y]))
    set_onnx_manifest(model, Manifest(model={"num_classes": 3}, labels=["a", "b", "c"],
                                      preprocess={"input_size": [8, 8]}, source=source))
    onnx.save(model, str(path))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_corpus_and_the_gallery_name_one_checkpoint_root(tmp_path: Path) -> None:
    """The corpus's shard records and the gallery's index check ask one walk (core/lineage.checkpoint_root): for an
    INT8, an FP16 and an engine made from model.onnx made from ckpt.pth they name ckpt.pth; with model.onnx replaced
    (another checkpoint's export) or removed, neither reads through it, and both fall back to what was recorded."""
    from vitdeploy.core.gallery import lineage_of
    from vitdeploy.core.lineage import checkpoint_root
    from vitdeploy.tools.corpus.identity import checkpoint_sha256

    ckpt = tmp_path / "ckpt.pth"
    ckpt.write_bytes(b"the weights of A")
    ck = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    fp32 = tmp_path / "model.onnx"
    fp32_sha = _onnx_with(fp32, {"kind": "checkpoint", "path": "ckpt.pth", "sha256": ck})
    int8, fp16 = tmp_path / "model.int8.onnx", tmp_path / "model.fp16.onnx"
    _onnx_with(int8, {"artifact": "model.onnx", "sha256": fp32_sha})
    _onnx_with(fp16, {"artifact": "model.onnx", "sha256": fp32_sha})
    engine = tmp_path / "model.int8.engine"  # its sidecar carries the INT8's own source as ``parent``, as builder writes
    engine.write_bytes(b"a serialized engine")
    int8_sha = hashlib.sha256(int8.read_bytes()).hexdigest()
    (tmp_path / "model.int8.engine.json").write_text(Manifest(
        model={"num_classes": 3}, labels=["a", "b", "c"], preprocess={"input_size": [8, 8]}, precision="int8",
        source={"artifact": int8.name, "sha256": int8_sha, "kind": "onnx",
                "parent": {"artifact": "model.onnx", "sha256": fp32_sha}}).to_json())

    def answers(p: Path) -> tuple[str | None, str, str]:
        m = read_manifest(p) if p.suffix != ".pth" else None
        root = checkpoint_root(p, m)
        lin = lineage_of(p, m)
        assert (lin.checkpoint, lin.shas) == (root.checkpoint, root.shas), p.name  # the gallery's is the one walk's
        return root.checkpoint, checkpoint_sha256(p, m), (root.shas or ("",))[-1]

    for p in (ckpt, fp32, int8, fp16, engine):
        assert answers(p) == (ck, ck, ck), p.name
    assert lineage_of(int8, read_manifest(int8)).same_model(lineage_of(ckpt, None))

    # model.onnx exported again from another checkpoint: its bytes no longer match what INT8/FP16 recorded, so its
    # manifest (naming B.pth) says nothing about them; the engine's embedded parent record still reaches model.onnx
    other = tmp_path / "B.pth"
    other.write_bytes(b"the weights of B")
    _onnx_with(fp32, {"kind": "checkpoint", "path": "B.pth", "sha256": hashlib.sha256(other.read_bytes()).hexdigest()})
    for p in (int8, fp16, engine):
        assert answers(p) == (None, fp32_sha, fp32_sha), p.name
    assert not lineage_of(int8, read_manifest(int8)).same_model(lineage_of(other, None))
    fp32.unlink()
    for p in (int8, fp16, engine):
        assert answers(p) == (None, fp32_sha, fp32_sha), p.name
    assert lineage_of(int8, read_manifest(int8), int8_sha).shas == (int8_sha, fp32_sha)
