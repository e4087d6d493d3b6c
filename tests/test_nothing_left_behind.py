"""Nothing written over an input the output check used not to see (--init weights, a Hugging Face folder's weights, the
--images folder or a user's index.html as --report, an earlier run's partial best); a failed command (a full disk,
simulated by a writer that raises ENOSPC) leaves no half-made report, maps, cache or partial; the bundle's modes follow
the umask; a legacy torch.save file is named as such."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vitdeploy.core.errors import UsageError, VitdeployError

VENV_BIN = Path(sys.executable).parent


def vitdeploy(*args: str, cwd: Path, umask: int | None = None) -> subprocess.CompletedProcess[str]:
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run([str(VENV_BIN / "vitdeploy"), *args], capture_output=True, text=True, cwd=cwd, timeout=600,
                          preexec_fn=pre)


def enospc(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


@pytest.fixture(scope="module")
def work(digits_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight vit-digits checkpoint and ONNX, a flat image folder and a tiny labeled one (2 classes)."""
    from vitdeploy.stages.export import export_onnx
    from vitdeploy.tools.bench import _random_checkpoint

    d = tmp_path_factory.mktemp("left")
    _random_checkpoint("vit-digits", d, seed=0)
    export_onnx(d / "ckpt.pth", d / "model.onnx", check=False)
    (d / "img").mkdir()
    for c in ("0", "1"):
        (d / "tiny" / c).mkdir(parents=True)
        for i, f in enumerate(sorted((digits_folder / "val" / c).glob("*.png"))[:5]):
            shutil.copy(f, d / "tiny" / c / f"{i}.png")
            if i < 2:
                shutil.copy(f, d / "img" / f"{c}_{i}.png")
    return d


# --- inside an input -------------------------------------------------------------------------------------------


def test_train_init_as_output_is_refused(work: Path) -> None:
    from vitdeploy.model.train import TrainOptions, check_options

    with pytest.raises(UsageError, match="input"):
        check_options(TrainOptions(init=work / "ckpt.pth", out=work / "ckpt.pth", epochs=1))


def test_import_over_a_hugging_face_folders_weights_is_refused(work: Path, tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "vit"}')
    for name in ("model.safetensors", "pytorch_model.bin"):
        (hf / name).write_bytes(b"the folder's own weights")
        r = vitdeploy("import", str(hf), "-o", str(hf / name), cwd=tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr
        assert (hf / name).read_bytes() == b"the folder's own weights"


def test_verify_report_into_the_images_folder_or_over_a_users_page_is_refused(work: Path, tmp_path: Path) -> None:
    r = vitdeploy("verify", "model.onnx", "model.onnx", "--images", "img", "--report", "img", cwd=work)
    assert r.returncode == 2, r.stdout + r.stderr
    assert listing(work / "img") == ["0_0.png", "0_1.png", "1_0.png", "1_1.png"]
    mine = tmp_path / "site"
    mine.mkdir()
    (mine / "index.html").write_text("<html>my own page</html>")
    r = vitdeploy("verify", "model.onnx", "model.onnx", "--images", "img", "--report", str(mine), cwd=work)
    assert r.returncode == 2 and "index.html" in r.stderr, r.stdout + r.stderr
    assert (mine / "index.html").read_text() == "<html>my own page</html>"


def test_an_earlier_runs_partial_best_is_kept_and_named(work: Path, tmp_path: Path) -> None:
    from vitdeploy.model.train import TrainOptions, partial_path, train

    out = tmp_path / "t.pth"
    partial_path(out).write_bytes(b"the best epoch of an interrupted run")
    events: list[tuple[str, dict[str, Any]]] = []
    train(work / "tiny", TrainOptions(epochs=1, out=out, batch_size=4, val_fraction=0.3, seed=0),
          progress=lambda k, d: events.append((k, d)))
    kept = out.with_name("t.pth.partial.1")
    assert kept.read_bytes() == b"the best epoch of an interrupted run"
    assert out.is_file() and not partial_path(out).exists()
    assert any(k == "note" and str(kept) in d["text"] for k, d in events)


# --- a full disk leaves nothing behind ------------------------------------------------------------------------------


# torch.save on a full disk raises this RuntimeError, not OSError (seen by scripts/probe_bad_inputs.py on a small tmpfs)
TORCH_FULL = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1901824 vs 1901712")


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), TORCH_FULL])
def test_train_on_a_full_disk_leaves_no_partial(work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               error: Exception) -> None:
    import vitdeploy.model.train as tr

    real_save = tr.save_checkpoint
    calls = [0]

    def save_then_fill(*a: Any, **k: Any) -> Any:  # the first epoch's best is written, the disk is full at the second
        calls[0] += 1
        if calls[0] > 1:
            raise error
        return real_save(*a, **k)

    accs = iter([0.1, 0.2, 0.3])
    monkeypatch.setattr(tr, "save_checkpoint", save_then_fill)
    monkeypatch.setattr(tr, "evaluate", lambda *a, **k: next(accs))  # every epoch is a new best
    out = tmp_path / "t.pth"
    with pytest.raises(VitdeployError):
        tr.train(work / "tiny", tr.TrainOptions(epochs=3, out=out, batch_size=4, val_fraction=0.3, seed=0))
    assert listing(tmp_path) == []


def test_verify_report_on_a_full_disk_leaves_no_folder(work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vitdeploy.checks.report as rep
    from vitdeploy.checks.verify import verify

    report = verify(work / "model.onnx", [work / "model.onnx"], work / "img")
    monkeypatch.setattr(rep, "plot_delta_histogram", enospc)  # after accuracy.png is written
    with pytest.raises(OSError):
        rep.write_report(report, tmp_path / "report")
    assert listing(tmp_path) == []


def test_explain_on_a_full_disk_leaves_no_maps(work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vitdeploy.tools.explain as ex

    real = ex.render
    calls = [0]

    def render_then_fill(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        if calls[0] > 1:
            enospc()
        return real(*a, **k)

    monkeypatch.setattr(ex, "render", render_then_fill)
    with pytest.raises(OSError):
        ex.explain(sorted((work / "img").iterdir()), work / "ckpt.pth", tmp_path / "maps", batch_size=1)
    assert listing(tmp_path) == []


def test_calibrate_on_a_full_disk_leaves_no_cache(work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vitdeploy.stages.precision as pr

    monkeypatch.setattr(pr, "_save", enospc)
    with pytest.raises(OSError):
        pr.calibrate(work / "model.onnx", images=work / "img", out=tmp_path / "m.int8.onnx", batch_size=2)
    assert listing(tmp_path) == []


# --- small things ---------------------------------------------------------------------------------------------------


def test_a_legacy_torch_save_file_is_named_as_such(tmp_path: Path) -> None:
    import torch

    from vitdeploy.model.checkpoint import load_checkpoint

    p = tmp_path / "old.pth"
    torch.save({"w": torch.zeros(2)}, p, _use_new_zipfile_serialization=False)
    with pytest.raises(VitdeployError, match="legacy torch.save file"):
        load_checkpoint(p)


def test_bundle_files_and_folders_follow_the_umask(work: Path, tmp_path: Path) -> None:
    r = vitdeploy("bundle", str(work / "model.onnx"), "-o", str(tmp_path / "b"), "--check-images", str(work / "img"),
                  "--references", "2", cwd=tmp_path, umask=0o077)
    assert r.returncode == 0, r.stdout + r.stderr
    loose = [(str(p.relative_to(tmp_path)), oct(stat.S_IMODE(p.stat().st_mode)))
             for p in [tmp_path / "b", *(tmp_path / "b").rglob("*")] if stat.S_IMODE(p.stat().st_mode) & 0o077]
    assert loose == []
    assert os.access(tmp_path / "b" / "build_engine.sh", os.X_OK)


def test_bundle_references_are_bounded(work: Path, tmp_path: Path) -> None:
    r = vitdeploy("bundle", str(work / "model.onnx"), "-o", str(tmp_path / "b"), "--references", "1000000000",
                  "--check-images", str(work / "img"), cwd=tmp_path)  # 4 images: bounded even where unchecked
    assert r.returncode == 2, r.stdout + r.stderr
    assert listing(tmp_path) == []


def test_a_report_and_maps_built_beside_are_moved_in_whole(work: Path, tmp_path: Path) -> None:
    import vitdeploy.tools.explain as ex
    from vitdeploy.checks.report import write_report
    from vitdeploy.checks.verify import verify

    report = verify(work / "model.onnx", [work / "model.onnx"], work / "img")
    for _ in range(2):  # a new folder, then the same folder again: our own page is replaced
        index = write_report(report, tmp_path / "report")
        assert index == tmp_path / "report" / "index.html" and "<title>vitdeploy verify" in index.read_text()
        assert (tmp_path / "report" / "accuracy.png").is_file()
    res = ex.explain(sorted((work / "img").iterdir()), work / "ckpt.pth", tmp_path / "maps", batch_size=1)
    assert sorted(p.name for p in (tmp_path / "maps").iterdir()) == sorted(e.output.name for e in res.explanations)
    assert listing(tmp_path) == ["maps", "report"]  # nothing left beside them
