"""Identity in lineage: an artifact reused, packed, picked or replaced for a command descends from that command's input.

Two checkpoints of one architecture and one set of classes side by side (the digits ViT as ckpt.pth, and B.pth: the
same weights moved), with ckpt.pth's model.onnx, model.int8.onnx and model.fp16.onnx beside them. Current is not
enough: those files are current (ckpt.pth is unchanged) and yet none of them is B.pth's model. `bundle B.pth` must
neither ship them nor replace them without a word (issue 40, A); build-engine, calibrate and convert-fp16 must not
replace another model's file at the name they chose; verify must not judge one model against another; infer's folder
pick must not answer with another checkpoint's model. The command the user asked for (`export B.pth`) still replaces
its own output, and then the rest is stale and re-made as before.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitdeploy.cli import app
from vitdeploy.core.errors import StaleArtifact
from vitdeploy.core.lineage import DESCENDS, FOREIGN, STALE, UNKNOWN, descends_from


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``folder``: its SHA-256 and mtime (what "nothing written" is checked against)."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, list(args), terminal_width=200)
    return r.exit_code, r.output


@pytest.fixture(scope="module")
def b_ckpt(digits_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """B.pth: the digits ViT with every weight moved by 0.02·N(0, 1): another checkpoint, same classes and config."""
    import torch

    from vitdeploy.model.checkpoint import load_checkpoint, save_checkpoint

    ck = load_checkpoint(digits_ckpt)
    model = ck.build()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    return save_checkpoint(tmp_path_factory.mktemp("b") / "B.pth", model, ck.manifest)


@pytest.fixture(scope="module")
def b_onnx(b_ckpt: Path) -> Path:
    """B.pth's model.onnx, exported in a folder of its own."""
    from vitdeploy.stages.export import export_onnx

    return export_onnx(b_ckpt, b_ckpt.parent / "model.onnx", check=False).path


@pytest.fixture
def work(digits_ckpt: Path, digits_artifacts: Path, b_ckpt: Path, tmp_path: Path) -> Path:
    """ckpt.pth with its model.onnx, model.int8.onnx (+ calibration cache) and model.fp16.onnx, and B.pth beside."""
    d = tmp_path / "w"
    d.mkdir()
    shutil.copy2(digits_ckpt, d / "ckpt.pth")
    for name in ("model.onnx", "model.int8.onnx", "model.int8.calib.json", "model.fp16.onnx"):
        shutil.copy2(digits_artifacts / name, d / name)
    shutil.copy2(b_ckpt, d / "B.pth")
    return d


def test_descends_from_walks_the_sha_chain_back_to_the_checkpoint(work: Path) -> None:
    for name in ("model.onnx", "model.int8.onnx", "model.fp16.onnx"):
        d = descends_from(work / name, work / "ckpt.pth")
        assert d.verdict == DESCENDS and d.usable, (name, d)
        d = descends_from(work / name, work / "B.pth")  # current, and yet not B's: made from ckpt.pth
        assert d.verdict == FOREIGN and not d.usable and d.made_from == work / "ckpt.pth", (name, d)
        assert d.made_from_sha256 == hashlib.sha256((work / "ckpt.pth").read_bytes()).hexdigest()
    shutil.copy2(work / "ckpt.pth", work / "same-bytes.pth")  # a copy is the same input: the chain is by SHA-256
    assert descends_from(work / "model.int8.onnx", work / "same-bytes.pth").verdict == DESCENDS
    (work / "ckpt.pth").write_bytes((work / "B.pth").read_bytes())  # retrained into ckpt.pth: made from an earlier one
    assert descends_from(work / "model.int8.onnx", work / "ckpt.pth").verdict == STALE
    (work / "model.onnx").unlink()  # the INT8's recorded source is gone: nothing shows it is ckpt.pth's
    d = descends_from(work / "model.int8.onnx", work / "ckpt.pth")
    assert d.verdict == UNKNOWN and not d.usable and d.made_from == work / "model.onnx"


@pytest.mark.parametrize("flags", [[], ["--int8"], ["--fp16"], ["-t", "trt10"], ["-t", "cpu", "--fp16"]],
                         ids=["all", "int8", "fp16", "trt10", "cpu-fp16"])
def test_bundle_of_another_checkpoint_refuses_before_any_work(work: Path, flags: list[str], digits_folder: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A (ckpt.pth)'s models in the folder; `bundle B.pth` exits 1 in one line naming B.pth, model.onnx and the
    checkpoint it was made from, and the ways out; nothing is written or replaced, whatever the target (with -t the
    earlier code re-made A's models over themselves and said only "made"); a re-run says the same."""
    monkeypatch.chdir(work)
    before = snapshot(work)
    for _ in range(2):  # and on a re-run
        code, out = cli("bundle", "B.pth", "-i", str(digits_folder / "val"), "-o", "bB", *flags)
        assert code == 1, out
        line = out.strip()
        assert "\n" not in line and "Traceback" not in out, out
        assert "B.pth" in line and "model.onnx" in line and "ckpt.pth" in line, line
        assert "folder of its own" in line and "`vitdeploy export B.pth`" in line, line
        assert not (work / "bB").exists() and snapshot(work) == before


def test_bundle_refuses_an_int8_whose_recorded_source_is_gone(work: Path, digits_folder: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """model.onnx removed: the INT8 beside ckpt.pth records a source that is not there, so nothing shows it is
    ckpt.pth's; it is neither calibrated over nor shipped (the earlier code exported model.onnx and replaced it)."""
    monkeypatch.chdir(work)
    (work / "model.onnx").unlink()
    before = snapshot(work)
    code, out = cli("bundle", "ckpt.pth", "-i", str(digits_folder / "val"), "-o", "b", "--int8")
    assert code == 1 and "model.int8.onnx" in out and "not made from ckpt.pth" in out and "not beside" in out, out
    assert snapshot(work) == before and not (work / "b").exists()


def test_export_replaces_its_own_output_and_then_the_rest_is_stale(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The way out the refusal names: `export B.pth` (asked for) replaces model.onnx, and says so; the INT8 and FP16
    made from the earlier model.onnx are then stale (re-made by bundle as before), and bundle B.pth's check lets
    them through."""
    from vitdeploy.stages.prepare import check_identity

    monkeypatch.chdir(work)
    code, out = cli("export", "B.pth", "--no-check")
    assert code == 0 and "note: replaced model.onnx (made from ckpt.pth" in out, out
    assert descends_from(work / "model.onnx", work / "B.pth").verdict == DESCENDS
    assert descends_from(work / "model.onnx", work / "ckpt.pth").verdict == FOREIGN
    for name in ("model.int8.onnx", "model.fp16.onnx"):
        assert descends_from(work / name, work / "B.pth").verdict == STALE
    check_identity(work / "B.pth", True, True)  # no refusal: re-made from B's model.onnx, as a stale file is
    with pytest.raises(StaleArtifact, match="model.onnx is in the way and was not made from"):
        check_identity(work / "ckpt.pth", True, True)


@pytest.fixture
def foreign_fp16(work: Path, b_onnx: Path) -> Path:
    """B's model.onnx beside A's as other.onnx, and `convert-fp16 other.onnx -o model.fp16.onnx` made from it."""
    from vitdeploy.stages.precision import convert_fp16

    shutil.copy2(b_onnx, work / "other.onnx")
    convert_fp16(work / "other.onnx", work / "model.fp16.onnx")
    return work / "model.fp16.onnx"


@pytest.mark.slow  # (a real FP16 made and converted again: 5 s under load)
def test_convert_fp16_refuses_another_models_file_at_its_default_output(work: Path, foreign_fp16: Path) -> None:
    from vitdeploy.stages.precision import convert_fp16

    before = snapshot(work)
    with pytest.raises(StaleArtifact) as e:
        convert_fp16(work / "model.onnx")
    msg = str(e.value)
    assert "model.fp16.onnx is in the way and was not made from" in msg and "other.onnx" in msg and "\n" not in msg
    assert f"-o {foreign_fp16}" in msg and snapshot(work) == before
    (work / "other.onnx").unlink()  # its recorded source gone: still not shown to be model.onnx's
    with pytest.raises(StaleArtifact, match="not beside"):
        convert_fp16(work / "model.onnx")
    convert_fp16(work / "model.onnx", foreign_fp16)  # -o naming it: asked for, replaced
    assert descends_from(foreign_fp16, work / "model.onnx").verdict == DESCENDS


def int8_of_other(work: Path, b_onnx: Path) -> Path:
    """B's model.onnx beside A's as other.onnx, and model.int8.onnx carrying the manifest `calibrate other.onnx -o
    model.int8.onnx` writes (its source: other.onnx and its SHA-256; the graph is the digits INT8's)."""
    from vitdeploy.core.artifact import OnnxArtifact

    shutil.copy2(b_onnx, work / "other.onnx")
    q = OnnxArtifact.open(work / "model.int8.onnx")
    man = q.manifest
    man.source = OnnxArtifact.open(work / "other.onnx").source_record()
    OnnxArtifact.write(q.model, man, work / "model.int8.onnx")
    assert descends_from(work / "model.int8.onnx", work / "other.onnx").verdict == DESCENDS
    return work / "model.int8.onnx"


def test_bundle_of_onnx_models_refuses_an_int8_of_another_model(work: Path, b_onnx: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`bundle` (the folder's model.onnx, model.fp16.onnx, model.int8.onnx) with the INT8 made from other.onnx: refused
    before anything is packed, as when the INT8 records a source that is gone."""
    from vitdeploy.stages.bundle import BundleOptions, bundle

    int8 = int8_of_other(work, b_onnx)
    monkeypatch.chdir(work)
    before = snapshot(work)
    code, out = cli("bundle", "-o", "b")
    assert code == 1 and "\n" not in out.strip(), out
    assert "model.int8.onnx was not made from" in out and "other.onnx" in out and "bundle one model's files" in out
    assert snapshot(work) == before and not (work / "b").exists()
    (work / "other.onnx").unlink()
    with pytest.raises(StaleArtifact, match="not beside"):
        bundle([work / "model.onnx", int8], tmp_path / "b2", BundleOptions(references=4))
    assert not (tmp_path / "b2").exists()


def test_calibrate_refuses_another_models_int8_before_reading_an_image(work: Path, b_onnx: Path,
                                                                       tmp_path: Path) -> None:
    """model.int8.onnx made from other.onnx (B's model); `calibrate model.onnx` on a folder with no image in it
    refuses the INT8 in the way first: no image was read, nothing written."""
    from vitdeploy.stages.precision import calibrate

    int8_of_other(work, b_onnx)
    before = snapshot(work)
    empty = tmp_path / "no-images"
    empty.mkdir()
    with pytest.raises(StaleArtifact) as e:
        calibrate(work / "model.onnx", empty)
    assert "calibrate: " in str(e.value) and "other.onnx" in str(e.value) and snapshot(work) == before


@pytest.mark.slow  # (a real FP16 or INT8 made from another model first: 3-5 s under load)
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_build_engine_refuses_another_models_artifact_in_the_way(work: Path, b_onnx: Path, precision: str,
                                                                 digits_folder: Path, tmp_path: Path) -> None:
    """`build-engine model.onnx --int8/--fp16` with model.int8.onnx / model.fp16.onnx made from another model there:
    refused before calibrating or converting (the earlier code replaced it, then said only that TensorRT is missing)."""
    from vitdeploy.stages.engine import BuildOptions, build_engine
    from vitdeploy.stages.precision import calibrate, convert_fp16

    shutil.copy2(b_onnx, work / "other.onnx")
    if precision == "fp16":
        convert_fp16(work / "other.onnx", work / "model.fp16.onnx")
    else:
        calibrate(work / "other.onnx", digits_folder / "val", work / "model.int8.onnx", num_images=64)
    before = snapshot(work)
    opts = BuildOptions(int8=precision == "int8", fp16=precision == "fp16", calib=tmp_path / "no-such-folder")
    with pytest.raises(StaleArtifact) as e:
        build_engine(work / "model.onnx", opts)
    assert f"model.{precision}.onnx is in the way" in str(e.value) and "other.onnx" in str(e.value)
    assert snapshot(work) == before


@pytest.mark.slow  # (models run on ten images: 5 s under load)
def test_verify_refuses_converted_models_of_another_model_and_names_a_checkpoint_mismatch(
        work: Path, b_onnx: Path, digits_val10: Path) -> None:
    """Two converted files of different models (ckpt.pth's model.onnx against B's model.fp16.onnx) are refused before
    any image is run; against B.pth, A's model.onnx is compared with a note saying what it was made from."""
    from vitdeploy.checks.verify import verify
    from vitdeploy.stages.precision import convert_fp16

    (work / "b").mkdir()
    shutil.copy2(b_onnx, work / "b" / "model.onnx")
    b16 = convert_fp16(work / "b" / "model.onnx")
    with pytest.raises(StaleArtifact) as e:
        verify(work / "model.onnx", [b16], digits_val10)
    msg = str(e.value)
    assert msg.startswith("verify: ") and "model.fp16.onnx was not made from" in msg and "\n" not in msg, msg
    rep = verify(work / "B.pth", [work / "model.onnx"], digits_val10)
    assert any("model.onnx was not made from" in n and "ckpt.pth" in n for n in rep.notes), rep.notes
    # one model's artifacts: INT8 and FP16 share model.onnx; both against the checkpoint they descend from
    rep = verify(work / "model.int8.onnx", [work / "model.fp16.onnx", work / "ckpt.pth"], digits_val10)
    assert len(rep.results) == 3 and not any("not made from" in n for n in rep.notes), rep.notes


def test_infer_folder_pick_passes_over_models_of_another_checkpoint(work: Path) -> None:
    """Only B.pth here with ckpt.pth's models: the pick falls back to B.pth itself, naming each model passed over;
    with ckpt.pth back, its INT8 is picked as before."""
    from vitdeploy.tools.infer import pick_model

    (work / "ckpt.pth").rename(work.parent / "ckpt.pth")
    runner, notes = pick_model(work)
    try:
        assert runner.artifact.name == "B.pth", notes
    finally:
        runner.close()
    for name in ("model.onnx", "model.int8.onnx", "model.fp16.onnx"):
        assert any(n.startswith(f"passed over {name}: not made from B.pth (made from ckpt.pth") for n in notes), notes
    (work.parent / "ckpt.pth").rename(work / "ckpt.pth")
    runner, notes = pick_model(work)
    try:
        assert runner.artifact.suffix == ".onnx" and not any("not made from" in n for n in notes), notes
    finally:
        runner.close()


# ------------------------------------------------------------------------------------------ end to end, per model kind


def _zero_class(ckpt: Path, out: Path, seed: int | None) -> Path:
    """The digits backbone without its head (a 0-class embedding model, as an imported DINOv2/SigLIP tower is);
    ``seed``: every weight moved by 0.05·N(0, 1) with it (another embedding model of the same shape)."""
    import torch

    from vitdeploy.model.checkpoint import load_checkpoint, save_checkpoint
    from vitdeploy.model.vit import VisionTransformer, ViTConfig

    ck = load_checkpoint(ckpt)
    cfg = ViTConfig.from_dict(ck.manifest.model).with_(num_classes=0)
    model = VisionTransformer(cfg)
    model.load_state_dict({k: v for k, v in ck.state_dict.items() if not k.startswith("head.")})
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    man = ck.manifest
    man.model, man.labels = cfg.to_dict(), []
    return save_checkpoint(out, model.eval(), man)


@pytest.fixture(scope="module")
def kinds(digits_ckpt: Path, b_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """(A.pth, B.pth) of each model kind: two digits classifiers; two embedding models (0-class towers); two
    zero-shot classifiers imported from one CLIP pair (tests/foundation_pairs.py) with other classes."""
    import foundation_pairs as fp
    import torch

    from vitdeploy.model.importers import import_checkpoint
    from vitdeploy.model.zero_shot import ZeroShotRequest

    root = tmp_path_factory.mktemp("kinds")
    out = {"classifier": (digits_ckpt, b_ckpt),
           "embedding": (_zero_class(digits_ckpt, root / "emb-A.pth", None),
                         _zero_class(digits_ckpt, root / "emb-B.pth", 3))}
    torch.manual_seed(0)
    pair = fp.hf_clip(root, fp.clip_bpe_tokenizer(root / "clip_bpe"))
    zs = []
    for name, classes in (("A", "cat\ndog\nrocket\n"), ("B", "astronaut\ncup of coffee\ncamera man\n")):
        (root / f"{name}.txt").write_text(classes)
        import_checkpoint(pair, root / f"zs-{name}.pth", zero_shot=ZeroShotRequest(root / f"{name}.txt", "openai"))
        zs.append(root / f"zs-{name}.pth")
    out["zero-shot"] = (zs[0], zs[1])
    return out


@pytest.mark.slow  # three kinds, each: bundle A (made), B refused (with and without -t, twice), A again, export B, bundle B
@pytest.mark.parametrize("kind", ["classifier", "embedding", "zero-shot"])
def test_bundle_never_ships_or_replaces_another_checkpoints_model(kind: str, kinds: dict[str, tuple[Path, Path]],
                                                                  digits_folder: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 40, A, for a classifier, an embedding model and a zero-shot classifier: A's bundle made in a folder,
    `bundle B.pth` refuses (exit 1, one line, nothing written), with or without -t, and on a re-run; A's own re-run
    still reuses its models; after `export B.pth` (the way out it names) B's bundle carries B's model and labels."""
    a_src, b_src = kinds[kind]
    monkeypatch.chdir(tmp_path)
    shutil.copy2(a_src, tmp_path / "A.pth")
    shutil.copy2(b_src, tmp_path / "B.pth")
    images = str(digits_folder / "val")
    made = ["--fp16"] if kind != "classifier" else []  # the classifier's INT8 too: calibrated with the guard for A
    code, out = cli("bundle", "A.pth", "-i", images, "-o", "bA", *made)
    assert code == 0, out
    before = snapshot(tmp_path)
    for flags in ([], ["-t", "trt10"], []):  # the last: a re-run
        code, out = cli("bundle", "B.pth", "-i", images, "-o", "bB", *flags)
        assert code == 1 and "\n" not in out.strip(), out
        assert "not made from B.pth (made from A.pth" in out and "`vitdeploy export B.pth`" in out, out
        assert snapshot(tmp_path) == before and not (tmp_path / "bB").exists()
    code, out = cli("bundle", "A.pth", "-i", images, "-o", "bA2", *made)  # A's re-run: its own models reused
    assert code == 0 and "reused" in out and "not made from" not in out, out
    code, out = cli("export", "B.pth", "-i", images)
    assert code == 0 and "note: replaced model.onnx (made from A.pth" in out, out
    code, out = cli("bundle", "B.pth", "-i", images, "-o", "bB", "--fp16")
    assert code == 0, out
    import json

    b_sha = hashlib.sha256((tmp_path / "B.pth").read_bytes()).hexdigest()
    for bundle, sha in (("bB", b_sha), ("bA", hashlib.sha256((tmp_path / "A.pth").read_bytes()).hexdigest())):
        assert json.loads((tmp_path / bundle / "manifest.json").read_text())["source"]["sha256"] == sha, bundle
    if kind == "zero-shot":  # B's classes, not A's
        assert (tmp_path / "bB" / "labels.txt").read_text().split("\n")[:3] == ["astronaut", "cup of coffee",
                                                                                "camera man"]


def test_build_engine_refuses_an_engine_of_another_model_at_its_name(work: Path, b_onnx: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """model.fp32.engine built from other.onnx (B's model, `build-engine other.onnx -o model.fp32.engine`) under the
    TensorRT mock made from the real bindings: `build-engine model.onnx` refuses it before building; `-o` naming it
    replaces it, and the new sidecar names model.onnx."""
    import sys

    import fake_libcuda
    from helpers import FakeHostCuda
    from trt_mock import fake_tensorrt

    from vitdeploy.core.artifact import read_manifest
    from vitdeploy.runners.tensorrt import cuda
    from vitdeploy.stages.engine import BuildOptions, build_engine

    monkeypatch.chdir(work)
    fake = FakeHostCuda()
    monkeypatch.setattr(cuda, "CudaRuntime", lambda *a, **k: fake)
    fake_libcuda.install(monkeypatch)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt("10.3.0.30", []))
    shutil.copy2(b_onnx, work / "other.onnx")
    engine = work / "model.fp32.engine"
    build_engine(work / "other.onnx", BuildOptions(out=engine))
    assert descends_from(engine, work / "other.onnx").verdict == DESCENDS
    before = snapshot(work)
    with pytest.raises(StaleArtifact) as e:
        build_engine(work / "model.onnx", BuildOptions())
    assert "model.fp32.engine is in the way" in str(e.value) and "other.onnx" in str(e.value)
    assert f"-o {engine}" in str(e.value) and snapshot(work) == before
    build_engine(work / "model.onnx", BuildOptions(out=engine))  # named: asked for, replaced
    assert read_manifest(engine).source["artifact"] == "model.onnx"
