"""Nothing lost, nothing written where it does not belong (issue 15), on real files, through the real commands.

Each test names the issue's item it covers; each failed on the code before the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_cases import CliCase, run_cli_cases
from PIL import Image

from vitdeploy.core.errors import UsageError
from vitdeploy.core.fileio import TMP_TAG, atomic_path, check_output, clean_stale, temp_dir_beside, write_text_atomic
from vitdeploy.core.preprocess import ImageReadError, load_image
from vitdeploy.tools.explain import output_names

VENV_BIN = Path(sys.executable).parent


def vitdeploy(*args: str, cwd: Path, umask: int | None = None) -> subprocess.CompletedProcess[str]:
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run([str(VENV_BIN / "vitdeploy"), *args], capture_output=True, text=True, cwd=cwd, timeout=600,
                          preexec_fn=pre)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def work(digits_ckpt: Path, digits_onnx: Path, digits_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("safe")
    shutil.copy(digits_ckpt, d / "ckpt.pth")
    shutil.copy(digits_onnx, d / "model.onnx")
    (d / "img").mkdir()
    (d / "img2").mkdir()
    val = sorted((digits_folder / "val").rglob("*.png"))
    shutil.copy(val[0], d / "img" / "a.png")
    shutil.copy(val[1], d / "img2" / "a.png")
    return d


def bomb(path: Path) -> Path:
    """A real PNG with more pixels than PIL decodes (2 x Image.MAX_IMAGE_PIXELS): it compresses to ~200 kB."""
    Image.fromarray(np.zeros((1, 1), np.uint8)).resize((16000, 12000)).save(path)
    return path


# item 1 ---------------------------------------------------------------------------------------------------------


def test_explain_maps_stay_inside_out_for_same_stems_by_absolute_path(work: Path, tmp_path: Path) -> None:
    a = work / "img" / "a.png"
    for paths in ([a, work / "img2" / "a.png"], [a, a], [Path("img/a.png"), a]):
        names = output_names(paths, tmp_path / "maps")
        assert all(n.parent == tmp_path / "maps" for n in names) and len(set(names)) == 2, names
    before = {p.name for p in Path("/").iterdir()}
    out = tmp_path / "e4"
    # one image twice by its absolute path: before, the names grew up to "/" and the maps went there
    r = vitdeploy("explain", str(a), str(a), str(work / "img2" / "a.png"), "--model", "model.onnx",
                  "-o", str(out), cwd=work)
    assert r.returncode == 0, r.stderr
    assert len(list(out.iterdir())) == 3 and all(p.suffix == ".png" for p in out.iterdir())
    assert {p.name for p in Path("/").iterdir()} == before


# items 2, 3, 11, 15: the one output check ------------------------------------------------------------------------


OUTPUT_REFUSALS = [
    ("convert-fp16", "model.onnx", "-o", "model.onnx"),
    ("convert-fp16", "model.onnx", "-o", "./img/../model.onnx"),
    ("convert-fp16", "model.onnx", "-o", "link.onnx"),
    ("calibrate", "model.onnx", "--images", "img", "--batch-size", "1", "-o", "model.onnx"),
    ("calibrate", "model.onnx", "--images", "img", "--batch-size", "1", "-o", "x.txt"),
    ("convert-fp16", "model.onnx", "-o", "x.txt"),
    ("import", "ckpt.pth", "-o", "ckpt.pth"),
    ("export", "ckpt.pth", "-o", "img"),
    ("verify", "model.onnx", "model.onnx", "--images", "img", "--json", "img"),
    ("benchmark", "model.onnx", "--json", "img"),
    ("infer", "img", "-o", "img"),
    ("explain", "img/a.png", "--model", "model.onnx", "-o", "model.onnx"),
    ("bundle", "model.onnx", "-o", "."),
]


@pytest.fixture(scope="module")
def output_refusals(work: Path) -> dict[tuple[str, ...], CliCase]:
    """Every OUTPUT_REFUSALS case run in ``work`` (with link.onnx, a link to model.onnx), in one process."""
    link = work / "link.onnx"
    if not link.exists():
        link.symlink_to(work / "model.onnx")
    before = tree(work)
    rows = {tuple(c.argv): c for c in run_cli_cases(OUTPUT_REFUSALS, work)}
    assert tree(work) == before  # every input intact, byte for byte
    return rows


@pytest.mark.parametrize("args", OUTPUT_REFUSALS, ids=lambda a: " ".join(a))
def test_outputs_are_checked_before_any_work(output_refusals: dict[tuple[str, ...], CliCase],
                                             args: tuple[str, ...]) -> None:
    r = output_refusals[args]
    assert r.code == 2, (r.code, r.stderr)
    assert len(r.lines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.changed == []  # the input is intact, nothing written


def test_import_over_its_source_keeps_train_state(work: Path) -> None:
    import torch

    before = torch.load(work / "ckpt.pth", weights_only=False, map_location="cpu")
    r = vitdeploy("import", "ckpt.pth", "-o", "ckpt.pth", cwd=work)
    assert r.returncode == 2 and "is the input" in r.stderr
    after = torch.load(work / "ckpt.pth", weights_only=False, map_location="cpu")
    assert set(after) == set(before)


def test_check_output_refuses_unwritable_and_wrong_kinds(tmp_path: Path) -> None:
    f = tmp_path / "f.onnx"
    f.write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        check_output(f, kind="dir")
    with pytest.raises(UsageError, match="is a folder"):
        check_output(tmp_path)
    with pytest.raises(UsageError, match="is a file, not a folder"):
        check_output(f / "inside.onnx")
    if os.access("/proc", os.W_OK):
        pytest.skip("this user can write to /proc")
    with pytest.raises(UsageError, match="not writable"):
        check_output("/proc/x.onnx")


def test_json_dash_is_stdout(work: Path) -> None:
    r = vitdeploy("verify", "model.onnx", "model.onnx", "--images", "img", "--json", "-", cwd=work)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["results"][0]["artifact"].endswith("model.onnx")
    assert not (work / "-").exists()


# item 4 ---------------------------------------------------------------------------------------------------------


def test_bundle_force_never_deletes_a_folder_that_is_not_a_bundle(work: Path) -> None:
    notes = work / "notes"
    notes.mkdir(exist_ok=True)
    (notes / "mine.txt").write_text("a user's notes\n")
    r = vitdeploy("bundle", "model.onnx", "-o", "notes", "--force", cwd=work)
    assert r.returncode == 2 and "not a vitdeploy bundle" in r.stderr, r.stderr
    assert (notes / "mine.txt").read_text() == "a user's notes\n"


# item 5 ---------------------------------------------------------------------------------------------------------


def test_build_engine_int8_keeps_a_guarded_int8_model(work: Path, tmp_path: Path) -> None:
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.core.manifest import set_onnx_manifest

    src = tmp_path / "model.onnx"
    shutil.copy(work / "model.onnx", src)
    import onnx

    guarded = onnx.load(str(src))
    m = read_onnx_manifest(src).derive(precision="int8")
    m.extra["guard"] = {"met": True, "excluded": []}
    set_onnx_manifest(guarded, m)
    onnx.save(guarded, str(tmp_path / "model.int8.onnx"))
    before = (tmp_path / "model.int8.onnx").read_bytes()
    r = vitdeploy("build-engine", "model.onnx", "--int8", "--calib", str(work / "img"), cwd=tmp_path)
    assert r.returncode == 2 and "accuracy guard" in r.stderr, r.stderr
    assert (tmp_path / "model.int8.onnx").read_bytes() == before


# item 7 ---------------------------------------------------------------------------------------------------------


def test_a_decompression_bomb_is_one_unreadable_image(work: Path, tmp_path: Path) -> None:
    b = bomb(tmp_path / "bomb.png")
    with pytest.raises(ImageReadError, match="too large"):
        load_image(b)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(work / "img" / "a.png", mixed / "a.png")
    shutil.copy(work / "img2" / "a.png", mixed / "b.png")
    shutil.move(b, mixed / "bomb.png")
    r = vitdeploy("infer", str(mixed), "--model", "model.onnx", "-o", str(tmp_path / "p.json"), cwd=work)
    assert r.returncode == 3, r.stderr
    assert len(json.loads((tmp_path / "p.json").read_text())) == 2 and "bomb.png" in r.stderr


# items 8, 9 -----------------------------------------------------------------------------------------------------


def test_artifacts_and_bundle_folders_follow_the_umask(work: Path, tmp_path: Path) -> None:
    for mask in (0o022, 0o002):
        d = tmp_path / f"m{mask:o}"
        d.mkdir()
        r = vitdeploy("convert-fp16", str(work / "model.onnx"), "-o", str(d / "model.fp16.onnx"), cwd=work, umask=mask)
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE((d / "model.fp16.onnx").stat().st_mode) == 0o666 & ~mask
    old = os.umask(0o027)
    try:
        write_text_atomic(tmp_path / "t.json", "{}")
        folder = temp_dir_beside(tmp_path / "bundle")
        assert stat.S_IMODE((tmp_path / "t.json").stat().st_mode) == 0o640
        assert stat.S_IMODE(folder.stat().st_mode) == 0o750
    finally:
        os.umask(old)


def test_a_killed_runs_temp_files_are_removed_by_the_next(tmp_path: Path) -> None:
    dest = tmp_path / "model.onnx"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # a process that has exited
    stale_file = tmp_path / f".model.onnx{TMP_TAG}{pid}-abc.onnx"
    stale_dir = tmp_path / f".model.onnx{TMP_TAG}{pid}-xyz"
    stale_file.write_bytes(b"half a model")
    stale_dir.mkdir()
    (stale_dir / "raw.onnx").write_bytes(b"x")
    running = tmp_path / f".model.onnx{TMP_TAG}{os.getppid()}-live.onnx"  # a live writer's: kept
    running.write_bytes(b"in progress")
    other = tmp_path / ".other.onnx.vitdeploy-tmp-1-x"  # another output's: not ours to remove
    other.write_bytes(b"x")
    with atomic_path(dest) as tmp:
        tmp.write_bytes(b"model")
    assert dest.read_bytes() == b"model"
    assert not stale_file.exists() and not stale_dir.exists() and running.exists() and other.exists()
    assert clean_stale(dest) == []


# item 14, 15 (calibrate exit 3, datasets) -------------------------------------------------------------------------


def test_calibrate_exits_3_when_it_skipped_files(work: Path, tmp_path: Path, digits_folder: Path) -> None:
    imgs = tmp_path / "calib"
    imgs.mkdir()
    for f in sorted((digits_folder / "train").rglob("*.png"))[:8]:
        shutil.copy(f, imgs / f"{f.parent.name}_{f.name}")
    (imgs / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n no")
    r = vitdeploy("calibrate", "model.onnx", "--images", str(imgs), "--batch-size", "4", "-o",
                  str(tmp_path / "m.int8.onnx"), cwd=work)
    assert r.returncode == 3 and "broken.png" in r.stderr, r.stderr
    assert (tmp_path / "m.int8.onnx").is_file()


def test_datasets_are_written_whole_or_not_at_all(tmp_path: Path) -> None:
    r = vitdeploy("datasets", "digits", "d", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no temp folder left beside it
    assert len(list((tmp_path / "d" / "val").rglob("*.png"))) == 360
    again = vitdeploy("datasets", "digits", "d", cwd=tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr


def test_messages_say_what_is_wrong_and_what_to_do(work: Path) -> None:
    r = vitdeploy("calibrate", "img", cwd=work)
    assert r.returncode == 1 and "is a folder" in r.stderr, r.stderr
    r = vitdeploy("infer", "img", "--model", "model.onnx", "--backend", "torch", cwd=work)
    assert "an ONNX model runs on onnxruntime or openvino, not torch" in r.stderr, r.stderr
    r = vitdeploy("calibrate", "model.onnx", "--images", "img", "--num-images", "10", "-o", "/tmp/never.onnx", cwd=work)
    assert "1 calibration image(s) from img" in r.stderr and "has 10" not in r.stderr, r.stderr


def test_file_names_with_brackets_print_as_written(work: Path, tmp_path: Path) -> None:
    d = tmp_path / "br"
    d.mkdir()
    shutil.copy(work / "img" / "a.png", d / "[red]x.png")
    (d / "[bold]broken.png").write_bytes(b"no")
    r = vitdeploy("infer", str(d), "--model", "model.onnx", cwd=work)
    assert r.returncode == 3 and "[bold]broken.png" in r.stderr, r.stderr
    assert "[red]x.png" in r.stdout, r.stdout
