"""One output rule in three places (issue 40, B): vitdeploy's (core/outputs.py output_refusal over
fileio.check_output), the bundle's run.py (out_refusal) and its C++ example (cpp/outputs.h), which cannot import
vitdeploy and so carry copies. The same cases, made on disk here, get the same answer from all three; and run.py's
--out refuses, through the real script, to write over the bundle's references or an input."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cpp_helpers import gxx
from helpers import load_run_py

from vitdeploy.core.outputs import output_refusal

REPO = Path(__file__).resolve().parents[1]
FILES = REPO / "vitdeploy" / "stages" / "bundle_files"

# a bundle's manifest (bundle.files, artifacts, reference), with names a JSON reader has to decode
MANIFEST = {"format": 1, "bundle": {
    "files": {"model.onnx": "0" * 64, "reference/inputs.npy": "1" * 64, "reference/embeddings.int8.npy": "2" * 64,
              "labels.txt": "3" * 64, "reference/images/000_caf\u00e9 \"q\".png": "4" * 64,
              "reference/images/001_\U0001f600.png": "5" * 64},
    "artifacts": {"model.onnx": {"sha256": "0" * 64}, "model.int8.onnx": {"sha256": "6" * 64}},
    "reference": {"inputs": "reference/inputs.npy", "logits": {"fp32": "reference/embeddings.fp32.npy"},
                  "tolerance": {"fp32": 1e-5}}}}


def listed_names() -> list[str]:
    b = MANIFEST["bundle"]
    return ["manifest.json", *b["files"], *b["artifacts"], b["reference"]["inputs"], *b["reference"]["logits"].values()]


def make_cases(t: Path) -> tuple[list[tuple[str, Path, bool]], list[Path]]:
    """(name, --out, refused?) on a bundle folder, an image folder and an image file made under ``t``."""
    b = t / "bundle"
    (b / "reference").mkdir(parents=True)
    (b / "manifest.json").write_text(json.dumps(MANIFEST))
    for rel in ("model.onnx", "reference/inputs.npy", "labels.txt", "emb.npy"):  # emb.npy: the user's, not listed
        (b / rel).write_bytes(rel.encode())
    (t / "img").mkdir()
    (t / "img" / "a.png").write_bytes(b"png")
    (t / "photo.png").write_bytes(b"photo")
    (t / "other.npy").write_bytes(b"other")
    (t / "link-photo.npy").symlink_to(t / "photo.png")
    os.link(t / "photo.png", t / "hard-photo.npy")
    (t / "link-model.npy").symlink_to(b / "model.onnx")
    os.link(b / "model.onnx", t / "hard-model.npy")
    (t / "link-refs.npy").symlink_to(b / "reference" / "inputs.npy")
    (t / "dangling.npy").symlink_to(t / "nowhere" / "x.npy")
    (t / "link-other.npy").symlink_to(t / "other.npy")
    (t / "blink").symlink_to(b)
    cases = [
        ("a new file", t / "emb.npy", False),
        ("a file of an input folder", t / "img" / "a.png", True),
        ("a new file in an input folder", t / "img" / "new.npy", False),
        ("the input file itself", t / "photo.png", True),
        ("a symlink to an input", t / "link-photo.npy", True),
        ("a hard link to an input", t / "hard-photo.npy", True),
        ("a bundle reference", b / "reference" / "inputs.npy", True),
        ("a bundle reference through ..", b / "reference" / ".." / "reference" / "inputs.npy", True),
        ("a listed file not there", b / "reference" / "embeddings.int8.npy", True),
        ("the manifest", b / "manifest.json", True),
        ("a listed model through a linked folder", t / "blink" / "model.onnx", True),
        ("a symlink to a bundle model", t / "link-model.npy", True),
        ("a hard link to a bundle model", t / "hard-model.npy", True),
        ("a symlink to a bundle reference", t / "link-refs.npy", True),
        ("the user's own file in the bundle", b / "emb.npy", False),
        ("a dangling symlink", t / "dangling.npy", False),
        ("a symlink to another file", t / "link-other.npy", False),
    ]
    return cases, [t / "img", t / "photo.png"]


def test_vitdeploy_and_run_py_apply_the_same_output_rule(tmp_path: Path) -> None:
    cases, inputs = make_cases(tmp_path)
    run_py = load_run_py(FILES / "run.py")
    listed = [tmp_path / "bundle" / n for n in listed_names()]
    for name, out, refused in cases:
        core = output_refusal(out, inputs, listed)
        copy = run_py.out_refusal(out, inputs, listed)
        assert bool(core) == refused, (name, core)
        assert bool(copy) == refused, (name, copy)


def test_run_py_lists_the_bundles_own_files_from_its_manifest(tmp_path: Path) -> None:
    run_py = load_run_py(FILES / "run.py")
    got = {p.relative_to(run_py.HERE).as_posix() for p in run_py.bundle_listed(MANIFEST["bundle"])}
    assert got == set(listed_names())


def test_the_cpp_example_applies_the_same_output_rule(tmp_path: Path) -> None:
    exe = tmp_path / "out_rule"
    r = subprocess.run([gxx(), "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{FILES / 'cpp'}",
                        str(REPO / "tests" / "cpp" / "out_rule.cpp"), "-o", str(exe)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    cases, inputs = make_cases(tmp_path / "w")
    b = tmp_path / "w" / "bundle"
    doc = {"listed_manifest": {"root": str(b), "text": (b / "manifest.json").read_text()},
           "cases": [{"out": str(out), "inputs": [str(i) for i in inputs]} for _, out, _ in cases]}
    r = subprocess.run([str(exe)], input=json.dumps(doc), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    head, _, tail = r.stdout.partition("--\n")
    names = [ln.split("\t")[0] for ln in head.splitlines()]
    assert set(names) == set(listed_names())  # the manifest read as run.py reads it, odd names decoded
    answers = tail.splitlines()
    assert len(answers) == len(cases)
    listed = [b / n for n in listed_names()]
    for (name, out, refused), got in zip(cases, answers, strict=True):
        assert got.startswith("refused") == refused, (name, got)
        assert bool(output_refusal(out, inputs, listed)) == refused, name


@pytest.mark.parametrize("out", ["reference/inputs.npy", "reference/embeddings.fp32.npy", "img/../reference/inputs.npy",
                                 "link.npy", "img/a.npy", "ref.npy"])
def test_run_py_out_never_writes_over_the_bundles_files_or_an_input(tmp_path: Path, out: str) -> None:
    """The real script, copied into a bundle-like folder: refused with exit 2 in one line before any model is read,
    every file as it was (ref.npy: ref.files.txt, its file list, is a hard link to a bundle file)."""
    import shutil
    import sys

    b = tmp_path / "b"
    (b / "reference").mkdir(parents=True)
    (b / "img").mkdir()
    shutil.copy(FILES / "run.py", b / "run.py")
    manifest = {"bundle": {"artifacts": {"model.onnx": {}}, "default_model": "model.onnx",
                           "files": {"model.onnx": "", "reference/inputs.npy": "", "reference/embeddings.fp32.npy": ""},
                           "reference": {"inputs": "reference/inputs.npy",
                                         "logits": {"fp32": "reference/embeddings.fp32.npy"}}},
                "preprocess": {"input_size": [8, 8]}, "labels": []}
    (b / "manifest.json").write_text(json.dumps(manifest))
    for rel in ("model.onnx", "reference/inputs.npy", "reference/embeddings.fp32.npy", "img/a.png", "img/a.npy"):
        (b / rel).write_bytes(rel.encode())
    (b / "link.npy").symlink_to(b / "reference" / "inputs.npy")
    os.link(b / "model.onnx", b / "ref.files.txt")
    before = {p: p.read_bytes() for p in b.rglob("*") if p.is_file()}
    r = subprocess.run([sys.executable, str(b / "run.py"), "img", "--out", out], cwd=b, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "never written over" in r.stderr, r.stderr
    assert {p: p.read_bytes() for p in b.rglob("*") if p.is_file()} == before


@pytest.mark.slow  # the shared digits bundle (int8 calibration and a bundle, once per session)
def test_run_py_out_in_a_real_bundle_keeps_its_references_and_writes_elsewhere(digits_bundle: Path, digits_folder: Path,
                                                                                tmp_path: Path) -> None:
    """`python3 run.py IMG --out reference/inputs.npy` overwrote the bundle's reference inputs with exit 0, and the
    next --check failed on them; now it is refused, and the same run with a free name writes it."""
    import shutil
    import sys

    b = tmp_path / "bundle"
    shutil.copytree(digits_bundle, b, symlinks=True)
    img = sorted((digits_folder / "val").rglob("*.png"))[0]
    refs = {p: p.read_bytes() for p in (b / "reference").glob("*.npy")}
    for out in ("reference/inputs.npy", *(f"reference/{p.name}" for p in refs if p.name != "inputs.npy")):
        r = subprocess.run([sys.executable, "run.py", str(img), "--out", out], cwd=b, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 2 and "is the bundle's own" in r.stderr, (out, r.returncode, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in refs} == refs
    r = subprocess.run([sys.executable, "run.py", str(img), "--out", "emb.npy"], cwd=b, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert (b / "emb.npy").is_file() and (b / "emb.files.txt").read_text().strip().endswith(img.name)
    r = subprocess.run([sys.executable, "run.py", "--check"], cwd=b, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow  # builds the C++ example (OpenCV) with the stub engine
def test_the_cpp_example_out_never_writes_over_the_bundles_files_and_replaces_a_link(tmp_path: Path) -> None:
    """classify --out: the bundle's references, a link to a bundle model and a file of the image folder are refused
    (exit 2, one line, every file as it was); a link at a free --out is replaced, its target untouched."""
    import numpy as np
    from cpp_helpers import build_with_stub, stub_engine
    from PIL import Image

    exe = build_with_stub(FILES / "cpp", tmp_path / "classify")
    b = tmp_path / "b"
    (b / "cpp").mkdir(parents=True)
    (b / "reference").mkdir()
    (b / "img").mkdir()
    (b / "cpp" / "bundle.cfg").write_text("input_height=8\ninput_width=8\nresize_mode=shorter\ninterpolation=bilinear\n"
                                          "task=embedding\noutput=embedding\nembedding_dim=4\n")
    manifest = {"bundle": {"files": {"model.raw.onnx": "", "reference/inputs.npy": "", "cpp/bundle.cfg": ""},
                           "artifacts": {"model.raw.onnx": {}},
                           "reference": {"inputs": "reference/inputs.npy",
                                         "logits": {"fp32": "reference/embeddings.fp32.npy"}}}}
    (b / "manifest.json").write_text(json.dumps(manifest))
    for rel in ("model.raw.onnx", "reference/inputs.npy", "img/a.npy"):
        (b / rel).write_bytes(rel.encode())
    Image.fromarray(np.full((8, 8, 3), 99, np.uint8)).save(b / "img" / "a.png")
    (b / "link.npy").symlink_to(b / "model.raw.onnx")
    eng, _ = stub_engine(tmp_path, 8, 8, 4)
    before = {p: p.read_bytes() for p in b.rglob("*") if p.is_file()}
    for out in ("reference/inputs.npy", "reference/embeddings.fp32.npy", "link.npy", "img/a.npy",
                "reference/../reference/inputs.npy"):
        r = subprocess.run([str(exe), str(eng), "img", "--out", out], cwd=b, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "never written over" in r.stderr, (out, r.returncode, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in b.rglob("*") if p.is_file()} == before
    (tmp_path / "outside.npy").write_bytes(b"keep")
    (b / "emb.npy").symlink_to(tmp_path / "outside.npy")
    r = subprocess.run([str(exe), str(eng), "img", "--out", "emb.npy"], cwd=b, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "outside.npy").read_bytes() == b"keep" and not (b / "emb.npy").is_symlink()
    assert np.load(b / "emb.npy").shape == (1, 4)
