"""Messages that say what is true (issue 40, sections F and H): each line a user meets names the real cause.

Every case was reproduced on 4f50930 first, as a user meets it: a digits ViT with random weights (finite outputs need
no training) made into an embedding model (its 0-class checkpoint, its ONNX export) and a copy that answers NaN (its
norms' gains set to NaN, or its ONNX output multiplied by NaN); SigLIP and DINOv2 towers made by transformers; a
features cache written by `train --probe` and then edited. The slow tests run the CLI in a subprocess, as a user does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import load_run_py

from vitdeploy.core.errors import UsageError, VitdeployError

REPO = Path(__file__).resolve().parents[1]
RUN_PY = REPO / "vitdeploy" / "stages" / "bundle_files" / "run.py"
VENV_BIN = Path(sys.executable).parent

# names a folder of photos may hold: a line feed, the two characters backslash and n, a trailing backslash, a tab,
# a byte that is not UTF-8, a C1 control, a right-to-left override, a BOM, non-ASCII letters and an emoji
TRICKY = ["a\nb.png", "a\\nb.png", "x\\", "t\tab.png", os.fsdecode(b"bad\xff.png"), "c1\x85.png", "rtl\u202egnp.exe",
          "\ufeffbom.png", "ÿ.png", "emoji\U0001f600.png", "\x1b[2J.png", "back\\x41.png", "plain.png"]


def vitdeploy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "vitdeploy"), *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def one_line(r: subprocess.CompletedProcess[str], code: int) -> str:
    """The command failed with ``code`` in one line of error and no traceback; returns the line."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


# --- the .parquet hint ------------------------------------------------------------------------------------------


def test_parquet_without_pyarrow_suggests_the_npy_and_its_files_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without pyarrow, -o emb.parquet is refused with the way out: -o emb.npy, whose file names go to emb.files.txt
    (the name infer writes), not "emb.parquet.txt" (a file nothing writes)."""
    import importlib.util

    from vitdeploy.core.task import EMBEDDING, Task
    from vitdeploy.tools.infer import check_embedding_output

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    with pytest.raises(UsageError) as e:
        check_embedding_output(Path("out/emb.parquet"), Task(EMBEDDING, 96), None, "emb.onnx")
    msg = str(e.value)
    assert "pip install pyarrow" in msg and "emb.npy" in msg and "emb.files.txt" in msg, msg
    assert "parquet.txt" not in msg, msg


# --- --min-cosine: the range --help shows is the range taken ----------------------------------------------------


@pytest.mark.parametrize("command", ["verify", "calibrate"])
def test_min_cosine_takes_the_range_its_help_shows(command: str, tmp_path: Path) -> None:
    """--help shows --min-cosine as [0.0<=x<=1.0] (Typer's bounds); every check behind it takes both ends and refuses
    past them, in the same words as any out-of-range option (0 used to be refused: "must be in (0, 1]")."""
    import re

    from typer.testing import CliRunner

    from vitdeploy.checks.judge import embedding_budget
    from vitdeploy.checks.verify import verify
    from vitdeploy.cli import app
    from vitdeploy.stages.precision import _check_options

    shown = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "1000"}).output
    lines = [ln for ln in shown.splitlines() if "--min-cosine " in ln]
    found = re.search(r"\[(\S+)<=x<=(\S+)\]", lines[0]) if len(lines) == 1 else None
    assert found is not None, lines
    lo, hi = float(found.group(1)), float(found.group(2))
    assert (lo, hi) == (0.0, 1.0)
    missing = tmp_path / "missing.onnx"
    for ok in (lo, hi):
        assert embedding_budget("int8", ok).min_cosine == ok
        _check_options("entropy", "fp32", 1, None, None, "eval", ok)
        with pytest.raises(VitdeployError, match="no such file"):  # past the option checks, to the first file
            verify(missing, [missing], images=tmp_path, min_cosine=ok)
    for bad in (lo - 1e-9, hi + 1e-9):
        with pytest.raises(UsageError, match="--min-cosine must be at (least|most)"):
            embedding_budget("int8", bad)
        with pytest.raises(UsageError, match="--min-cosine must be at (least|most)"):
            _check_options("entropy", "fp32", 1, None, None, "eval", bad)
        with pytest.raises(UsageError, match="--min-cosine must be at (least|most)"):
            verify(missing, [missing], images=tmp_path, min_cosine=bad)


# --- --gallery FILE ---------------------------------------------------------------------------------------------


def test_gallery_that_is_a_file_is_called_a_file(tmp_path: Path) -> None:
    from vitdeploy.tools.infer import read_gallery

    f = tmp_path / "gallery.png"
    f.write_bytes(b"\x89PNG")
    with pytest.raises(UsageError) as e:
        read_gallery(f)
    assert "is a file, not a folder" in str(e.value) and "no such" not in str(e.value), e.value
    with pytest.raises(UsageError, match="no such folder"):
        read_gallery(tmp_path / "missing")


# --- .files.txt: one line, one name -----------------------------------------------------------------------------


def test_files_list_lines_mean_one_name_each_and_read_back_exactly() -> None:
    """A line feed in a name and a name spelled with a backslash and an n used to give the same line; each line now
    means one name, and read_file_list gives back the name as it was on disk (bytes that are not UTF-8 too)."""
    from vitdeploy.core.file_list import file_list_line, parse_file_list_line

    lines = [file_list_line(n) for n in TRICKY]
    assert len(set(lines)) == len(TRICKY), lines
    assert lines[0] == "a\\nb.png" and lines[1] == "a\\\\nb.png"
    for name, line in zip(TRICKY, lines, strict=True):
        assert "\n" not in line and "\r" not in line and line.isprintable(), line
        assert parse_file_list_line(line) == name
    with pytest.raises(ValueError, match="begins no escape"):
        parse_file_list_line("stray\\q.png")


def test_run_py_writes_the_files_list_as_vitdeploy_does() -> None:
    """run.py cannot import vitdeploy, so it carries its own copy of the rule: both give the same line for every name
    (as str, as a Path, and as the bytes the OS gives)."""
    from vitdeploy.core.file_list import file_list_line

    run = load_run_py(RUN_PY)
    for name in TRICKY:
        want = file_list_line(name)
        assert run.list_line(name) == want and run.list_line(Path(name)) == want, name
        assert run.list_line(os.fsencode(name)) == want and file_list_line(os.fsencode(name)) == want, name


def test_infer_writes_distinct_lines_for_a_newline_and_a_backslash_n(tmp_path: Path) -> None:
    from vitdeploy.core.file_list import read_file_list
    from vitdeploy.core.task import EMBEDDING, Task
    from vitdeploy.tools.infer import EmbedResult, write_embeddings

    paths = [tmp_path / n for n in TRICKY]
    res = EmbedResult(tmp_path / "m.onnx", "onnxruntime", "fp32", Task(EMBEDDING, 4), paths,
                      np.arange(4 * len(paths), dtype=np.float32).reshape(len(paths), 4))
    written = write_embeddings(res, tmp_path / "emb.npy")
    assert written == [tmp_path / "emb.npy", tmp_path / "emb.files.txt"]
    lines = (tmp_path / "emb.files.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len(TRICKY) == len(set(lines)), lines
    assert read_file_list(tmp_path / "emb.files.txt") == [str(p) for p in paths]


@pytest.mark.slow  # a C++ build (about 5 s of CPU)
def test_cpp_example_writes_the_files_list_as_vitdeploy_does(tmp_path: Path) -> None:
    """The C++ example's list_line, compiled from the bundle's own classify.cpp, gives vitdeploy's line for each name
    passed to it as raw bytes (what argv and the file system hold)."""
    from cpp_helpers import OPENCV_INCLUDE, STUB, gxx

    from vitdeploy.core.file_list import file_list_line

    if not (OPENCV_INCLUDE / "opencv2" / "imgcodecs.hpp").exists():
        pytest.skip("libopencv-dev is not installed (Debian: apt-get install libopencv-dev)")
    src = RUN_PY.parent / "cpp"
    driver = tmp_path / "list_line.cpp"
    driver.write_text('#define main classify_main\n#include "classify.cpp"\n#undef main\n'
                      "int main(int argc, char** argv) {\n"
                      '  for (int i = 1; i < argc; ++i) std::printf("%s\\n", list_line(argv[i]).c_str());\n'
                      "  return 0;\n}\n")
    exe = tmp_path / "list_line"
    r = subprocess.run([gxx(), "-std=c++17", "-O0", "-Wall", "-Wextra", "-Werror", f"-I{src}", "-isystem",
                        str(OPENCV_INCLUDE), str(driver), str(src / "vitclassify.cpp"), str(STUB),
                        "-lopencv_imgcodecs", "-lopencv_core", "-o", str(exe)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    # besides TRICKY: an overlong form, a UTF-16 surrogate written as UTF-8, a cut 4-byte sequence, past U+10FFFF
    raw = [os.fsencode(n) for n in TRICKY] + [b"over\xc0\xafl", b"sur\xed\xa0\x80", b"cut\xf0\x90\x80A", b"big\xf4\x90\x80\x80"]
    out = subprocess.run([str(exe), *raw], capture_output=True, timeout=60).stdout.decode("utf-8").split("\n")[:-1]
    assert out == [file_list_line(b) for b in raw]


# --- an HF config whose patch_size contradicts its weights ------------------------------------------------------


@pytest.mark.parametrize("patch_size", [-8, 16, [8, 4]])
def test_hf_patch_size_that_contradicts_the_weights_is_refused_naming_file_and_field(
        patch_size: Any, tmp_path: Path) -> None:
    """A DINOv2 saved by transformers with patch 8, its config.json then edited: -8, 16 or [8, 4] beside a kernel of
    8x8 used to import silently with the weights' 8. Refused, naming config.json and patch_size; the config as saved
    still imports."""
    T = pytest.importorskip("transformers")
    from vitdeploy.model.importers import load_any

    d = tmp_path / "dinov2"
    T.Dinov2Model(T.Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 image_size=32, patch_size=8)).save_pretrained(d)
    assert load_any(d).manifest.model["patch_size"] == 8
    cfg = json.loads((d / "config.json").read_text())
    cfg["patch_size"] = patch_size
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VitdeployError) as e:
        load_any(d)
    msg = str(e.value)
    assert "config.json" in msg and "patch_size" in msg and "\n" not in msg, msg


# --- the CLI on an embedding model, and on one that answers NaN -------------------------------------------------


@pytest.fixture(scope="module")
def work(digits_val10: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight digits ViT's 0-class checkpoint (bb.pth), a copy whose norms' gains are NaN (nan.pth), bb.pth's
    ONNX export (emb.onnx) and a copy of it whose output is multiplied by NaN (nan.onnx); 16 digit scans (imgs/)."""
    import onnx
    import torch
    from onnx import helper

    from vitdeploy.model.checkpoint import save_checkpoint
    from vitdeploy.model.importers import load_any
    from vitdeploy.stages.export import EmbeddingOptions, export_onnx
    from vitdeploy.tools.bench import _random_checkpoint

    d = tmp_path_factory.mktemp("messages")
    _random_checkpoint("vit-digits", d, seed=0)
    bb = EmbeddingOptions(embedding=True).apply(load_any(d / "ckpt.pth"), str(d / "ckpt.pth"))
    model = bb.build()
    save_checkpoint(d / "bb.pth", model, bb.manifest)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(float("nan"))
    save_checkpoint(d / "nan.pth", model, bb.manifest)
    export_onnx(d / "bb.pth", d / "emb.onnx", check=False)
    m = onnx.load(str(d / "emb.onnx"))
    out = m.graph.output[0].name
    for node in m.graph.node:
        node.output[:] = [f"{o}_pre_nan" if o == out else o for o in node.output]
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.array(np.nan, np.float32), "nan_scale"))
    m.graph.node.append(helper.make_node("Mul", [f"{out}_pre_nan", "nan_scale"], [out]))
    onnx.save(m, str(d / "nan.onnx"))
    (d / "imgs").mkdir()
    for f in sorted(digits_val10.rglob("*.png"))[::6][:16]:
        shutil.copy(f, d / "imgs" / f"{f.parent.name}_{f.name}")
    return d


@pytest.mark.slow
def test_exporting_a_checkpoint_that_answers_nan_is_one_line_naming_it(work: Path) -> None:
    """It used to end in ZeroDivisionError (the parity limit of an all-NaN reference is 0)."""
    line = one_line(vitdeploy("export", "nan.pth", "-o", "nan_export.onnx", "-i", "imgs", cwd=work), 1)
    assert "the checkpoint itself (PyTorch) gives NaN or Inf embeddings" in line and "nan_export.onnx not written" in line
    assert "ZeroDivision" not in line and not (work / "nan_export.onnx").exists()


@pytest.mark.slow
def test_infer_with_a_nan_model_names_the_model_not_the_images(work: Path) -> None:
    """Every image was read; the model answered NaN for each: not "none of the 16 image(s) could be read"."""
    line = one_line(vitdeploy("infer", "imgs", "--model", "nan.onnx", "-o", "e.npy", cwd=work), 1)
    assert "could be read" not in line and "NaN or Inf values for all 16 image(s) it read" in line, line
    assert "the model is broken, not the images" in line and not (work / "e.npy").exists()


@pytest.mark.slow
def test_calibrate_guard_after_a_nan_fp32_names_the_fp32_model_not_the_budget(work: Path) -> None:
    """INT8 cannot be judged against an FP32 model that answers NaN: the line says so, and never "loosen the budget"."""
    r = vitdeploy("calibrate", "nan.onnx", "-i", "imgs", "--eval", "imgs", "--min-cosine", "0.9", "-b", "8",
                  "-o", "nan.int8.onnx", cwd=work)
    line = one_line(r, 1)
    assert "loosen" not in line and "the FP32 model gives NaN or Inf embeddings on 16 of 16 --eval images" in line, line
    assert not (work / "nan.int8.onnx").exists()


@pytest.mark.slow
def test_bundle_of_a_nan_embedding_model_says_embeddings(work: Path) -> None:
    line = one_line(vitdeploy("bundle", "nan.onnx", "-o", "b", "--check-images", "imgs", "--references", "2",
                              cwd=work), 1)
    assert "NaN or Inf embeddings on 2 of 2 images" in line and "logits" not in line, line
    assert not (work / "b").exists()


@pytest.mark.slow
def test_verify_takes_min_cosine_zero_as_its_help_shows(work: Path) -> None:
    r = vitdeploy("verify", "emb.onnx", "emb.onnx", "--images", "imgs", "--min-cosine", "0", "--json", "-", cwd=work)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["passed"] is True


@pytest.mark.slow
def test_infer_gallery_file_says_it_is_a_file(work: Path) -> None:
    line = one_line(vitdeploy("infer", "imgs", "--model", "emb.onnx", "--gallery", "emb.onnx", cwd=work), 2)
    assert "--gallery emb.onnx: is a file, not a folder" in line and "no such" not in line, line


@pytest.mark.slow
def test_probe_pool_on_siglip_names_its_map_pooling(work: Path, digits_val10: Path) -> None:
    """SigLIP pools by its MAP head; --pool cls used to be refused with "has mean", as if mean were its pooling."""
    from foundation_pairs import vision_towers

    towers = vision_towers(work / "towers")
    line = one_line(vitdeploy("train", str(digits_val10), "--init", str(towers["siglip_vision"]), "--probe", "linear",
                              "--pool", "cls", "-o", "p.pth", cwd=work), 2)
    assert "pools by map itself and --pool takes mean" in line and "has mean" not in line, line


# --- a features cache whose key matches but whose arrays disagree -----------------------------------------------


def _shrink(z: dict[str, Any]) -> None:
    z["features"] = z["features"][:, :5]  # was: "internal: a 5-d probe for 64-d features"


def _bad_labels(z: dict[str, Any]) -> None:
    z["labels"] = z["labels"] + 100  # was: IndexError


def _nan(z: dict[str, Any]) -> None:
    z["features"] = np.full_like(z["features"], np.nan)  # was: "the folded classifier answers nan"


def _empty(z: dict[str, Any]) -> None:  # was: "no readable image"
    n = len(z["features"])
    z["skipped"] = np.array(json.dumps([[p, "unreadable"] for p in z["paths"].tolist()]))
    for k in ("features", "labels", "items", "paths"):
        z[k] = z[k][:0]
    if len(z["is_val"]) == n:
        z["is_val"] = z["is_val"][:0]


@pytest.fixture(scope="module")
def probed(work: Path, digits_val10: Path) -> tuple[Path, float]:
    """A linear probe on bb.pth over 100 digit scans: its features cache, and its val top-1."""
    from vitdeploy.model.probe import cache_path, train_probe
    from vitdeploy.model.train_options import TrainOptions

    opts = TrainOptions(init=work / "bb.pth", probe="linear", out=work / "probe" / "p.pth")
    (work / "probe").mkdir()
    return cache_path(opts.out), train_probe(digits_val10, opts).fit.val_accuracy


@pytest.mark.slow
@pytest.mark.parametrize("edit", [_shrink, _bad_labels, _nan, _empty], ids=["width", "labels", "nan", "empty"])
def test_features_cache_that_disagrees_with_its_key_is_recomputed_with_a_note(
        edit: Any, work: Path, probed: tuple[Path, float], digits_val10: Path, tmp_path: Path) -> None:
    """A features cache keeps its key (what the features were made from) beside arrays an edit or a damaged copy
    changed: the probe recomputes them, says so in one note naming the file, and trains as on a fresh run."""
    from vitdeploy.model.probe import cache_path, train_probe
    from vitdeploy.model.train_options import TrainOptions

    made, val_top1 = probed
    opts = TrainOptions(init=work / "bb.pth", probe="linear", out=tmp_path / "p.pth")
    cache = cache_path(opts.out)
    with np.load(made, allow_pickle=False) as f:
        z = {k: f[k] for k in f.files}
    width = z["features"].shape[1]
    edit(z)
    with open(cache, "wb") as fh:
        np.savez(fh, **z)
    events: list[tuple[str, dict[str, Any]]] = []
    again = train_probe(digits_val10, opts, lambda kind, d: events.append((kind, d)))
    notes = [d["text"] for kind, d in events if kind == "note"]
    assert len(notes) == 1 and notes[0].startswith(f"{cache}: ") and notes[0].endswith("recomputed"), notes
    assert again.features.computed and again.fit.val_accuracy == val_top1  # the features made again, the same probe
    with np.load(cache, allow_pickle=False) as f:  # and the cache is whole again
        assert f["features"].shape == (100, width) and np.isfinite(f["features"]).all()
