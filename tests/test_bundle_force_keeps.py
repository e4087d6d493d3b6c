"""`bundle --force` never deletes what the bundle did not write, an unreadable reference image is skipped and named,
and a model re-written while the bundle reads it is one line (issue 31, items 2, 10 and 18b)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vitdeploy.cli.app import app
from vitdeploy.core.errors import VitdeployError
from vitdeploy.stages.bundle import BundleOptions, bundle


@pytest.fixture
def val4(digits_folder: Path, tmp_path: Path) -> Path:
    """Four readable digit images, one of each of four classes."""
    out = tmp_path / "val4"
    out.mkdir()
    for d in sorted((digits_folder / "val").iterdir())[:4]:
        f = sorted(d.iterdir())[0]
        shutil.copy(f, out / f"{d.name}_{f.name}")
    return out


def opts(images: Path, **kw: object) -> BundleOptions:
    return BundleOptions(opt_batch=2, max_batch=4, check_images=[images], references=4, **kw)  # type: ignore[arg-type]


def test_force_keeps_what_the_bundle_did_not_write_and_sets_stale_engines_aside(
        digits_onnx: Path, digits_fp16: Path, val4: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    bundle([digits_onnx], out, opts(val4))
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} - {"manifest.json"}
    # what a user adds on the device and beside it
    (out / "field_results.csv").write_text("notes\n")
    (out / "timing.cache").write_bytes(b"tactics")
    (out / "model.raw.engine").write_bytes(b"an engine of the first models")
    (out / "model.raw.engine.json").write_text("{}")
    (out / "cpp" / "build").mkdir()
    (out / "cpp" / "build" / "classify").write_bytes(b"\x7fELF")
    pbtxt = next(out.glob("triton/*/config.pbtxt"))
    pbtxt.write_text(pbtxt.read_text() + "# the user's edit\n")
    edited = pbtxt.read_text()

    # the same model again: everything the user added stays where it is; the edited file is set aside, not lost
    r = bundle([digits_onnx], out, opts(val4, force=True))
    assert (out / "field_results.csv").read_text() == "notes\n"
    assert (out / "timing.cache").read_bytes() == b"tactics"
    assert (out / "model.raw.engine").read_bytes() == b"an engine of the first models"  # its models are unchanged
    assert (out / "cpp" / "build" / "classify").read_bytes() == b"\x7fELF"
    rel = pbtxt.relative_to(out).as_posix()
    assert (out / "earlier" / rel).read_text() == edited and "# the user's edit" not in pbtxt.read_text()
    said = "\n".join(r.kept)
    for name in ("field_results.csv", "timing.cache", "model.raw.engine", "cpp/build/classify", rel):
        assert name in said, said
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".b.")]  # nothing set aside is left behind

    # other models (FP16 added): the engine built from the earlier ones must not stay where run.py would take it
    res = CliRunner().invoke(app, ["bundle", str(digits_onnx), str(digits_fp16), "-o", str(out), "--force",
                                   "--references", "4", "--opt-batch", "2", "--max-batch", "4", "-i", str(val4)],
                             terminal_width=200)
    assert res.exit_code == 0, res.output
    assert not (out / "model.raw.engine").exists() and not (out / "model.raw.engine.json").exists()
    assert (out / "earlier" / "model.raw.engine").read_bytes() == b"an engine of the first models"
    assert (out / "earlier" / "model.raw.engine.json").read_text() == "{}"
    assert (out / "field_results.csv").read_text() == "notes\n" and (out / "earlier" / rel).read_text() == edited
    assert "field_results.csv" in res.output and "earlier/model.raw.engine" in res.output
    assert "rebuild it with ./build_engine.sh" in res.output
    assert (out / "model.fp16.onnx").is_file()
    # the manifest lists what the bundle wrote (what the next --force replaces), and nothing of the user's
    listed = set(json.loads((out / "manifest.json").read_text())["bundle"]["files"])
    users = ("earlier/", "field_results.csv", "timing.cache", "cpp/build/")
    now = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} - {"manifest.json"}
    assert listed == {n for n in now if not n.startswith(users)} and "model.onnx" in written


def test_force_over_a_bundle_without_a_file_list_keeps_the_users_files(digits_onnx: Path, val4: Path,
                                                                          tmp_path: Path) -> None:
    """A bundle written before the manifest listed its files: what neither its manifest names nor a bundle writes
    is the user's."""
    out = tmp_path / "b"
    bundle([digits_onnx], out, opts(val4))
    man = json.loads((out / "manifest.json").read_text())
    man["bundle"].pop("files", None)
    (out / "manifest.json").write_text(json.dumps(man))
    (out / "field_results.csv").write_text("notes\n")
    r = bundle([digits_onnx], out, opts(val4, force=True))
    assert (out / "field_results.csv").read_text() == "notes\n" and "field_results.csv" in "\n".join(r.kept)
    assert not (out / "earlier").exists()


def test_an_unreadable_reference_image_is_skipped_and_named(digits_onnx: Path, val4: Path, tmp_path: Path) -> None:
    (val4 / "0_empty.png").write_bytes(b"")  # sorted first: the first image the reference step picks
    (val4 / "1_text.png").write_text("not an image")
    out = tmp_path / "b"
    res = CliRunner().invoke(app, ["bundle", str(digits_onnx), "-o", str(out), "--references", "4", "--opt-batch", "2",
                                   "--max-batch", "4", "-i", str(val4)], terminal_width=200)
    assert res.exit_code == 3, res.output  # partly done: written, with readable images in their place
    assert "0_empty.png" in res.output and "empty file" in res.output and "1_text.png" in res.output
    assert "Traceback" not in res.output
    man = json.loads((out / "manifest.json").read_text())
    refs = man["bundle"]["reference"]["images"]
    assert len(refs) == 4 and not any("empty" in r or "text" in r for r in refs)
    assert np.load(out / "reference" / "inputs.npy").shape[0] == 4
    assert np.load(out / man["bundle"]["reference"]["logits"]["fp32"]).shape[0] == 4


def test_a_model_rewritten_while_bundle_reads_it_is_one_line(digits_onnx: Path, val4: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-export lands on model.onnx after bundle has read it: the real reason, not "this is a bug"."""
    import onnx
    from onnx import numpy_helper

    import vitdeploy.stages.bundle as stage

    src = tmp_path / "model.onnx"
    shutil.copy(digits_onnx, src)
    other = onnx.load(str(src))  # the same model with other weights: a re-export after more training
    init = max(other.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    onnx.save(other, str(tmp_path / "next.onnx"))
    real = stage.check_target

    def then_re_exported(*a: object, **kw: object) -> object:  # runs once the models are read
        got = real(*a, **kw)  # type: ignore[arg-type]
        os.replace(tmp_path / "next.onnx", src)
        return got

    monkeypatch.setattr(stage, "check_target", then_re_exported)
    out = tmp_path / "b"
    with pytest.raises(VitdeployError) as e:
        bundle([src], out, opts(val4))
    msg = str(e.value)
    assert "model.onnx changed while bundle ran" in msg and "bug" not in msg and "\n" not in msg
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".b.")]


def test_force_never_moves_a_users_file_through_a_link_out_of_the_bundle(tmp_path: Path) -> None:
    """An `earlier` link of the user's (to a folder outside) is kept and never written through; the engine of the
    earlier models goes to a folder of its own inside the bundle."""
    from vitdeploy.core.fileio import sha256_file
    from vitdeploy.stages.bundle_replace import replace_bundle

    def write_bundle(root: Path, model: bytes) -> None:
        root.mkdir()
        (root / "model.onnx").write_bytes(model)
        (root / "README.md").write_text("the bundle's\n")
        files = {n: sha256_file(root / n) for n in ("model.onnx", "README.md")}
        arts = {"model.onnx": {"sha256": files["model.onnx"]}}
        (root / "manifest.json").write_text(json.dumps({"bundle": {"files": files, "artifacts": arts, "batch": {}}}))

    outside = tmp_path / "outside"
    outside.mkdir()
    out, new = tmp_path / "b", tmp_path / "new"
    write_bundle(out, b"first model")
    (out / "earlier").symlink_to(outside)
    (out / "model.engine").write_bytes(b"engine of the first model")
    write_bundle(new, b"second model")
    lines = replace_bundle(new, out, force=True)
    assert list(outside.iterdir()) == [] and (out / "earlier").is_symlink()
    assert (out / "earlier-1" / "model.engine").read_bytes() == b"engine of the first model"
    assert (out / "model.onnx").read_bytes() == b"second model" and not (out / "model.engine").exists()
    assert any("earlier-1/model.engine" in ln for ln in lines) and any("earlier" in ln for ln in lines)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".b.")]
