"""infer --gallery with unreadable gallery images (issue 40, D): each is named and skipped, and the run is partly
done (exit 3), as with unreadable input images: a label voted by fewer gallery images than the folder holds is not
the whole answer asked for."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitdeploy.cli import app

# an export of the digits ViT per module (about 10 s here): `make test-all` and CI run these
pytestmark = pytest.mark.slow

cli = CliRunner()


@pytest.fixture(scope="module")
def emb_onnx(digits_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vitdeploy.stages.export import EmbeddingOptions, export_onnx

    d = tmp_path_factory.mktemp("gal")
    out = d / "emb.onnx"
    export_onnx(shutil.copy(digits_ckpt, d / "ckpt.pth"), out, check=False, embedding=EmbeddingOptions(embedding=True))
    return out


def _gallery_with_broken_images(digits_val10: Path, tmp_path: Path) -> Path:
    g = tmp_path / "gallery"
    shutil.copytree(digits_val10, g)
    (g / "3" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")  # a truncated PNG: undecodable
    (g / "5" / "empty.png").write_bytes(b"")
    return g


def test_infer_gallery_with_unreadable_images_is_partly_done(emb_onnx: Path, digits_val10: Path,
                                                             tmp_path: Path) -> None:
    g = _gallery_with_broken_images(digits_val10, tmp_path)
    r = cli.invoke(app, ["infer", str(digits_val10 / "7"), "-m", str(emb_onnx), "--gallery", str(g)])
    assert r.exit_code == 3, r.output
    assert "Traceback" not in r.output
    assert "broken.png skipped" in r.output and "empty.png skipped" in r.output, r.output
    assert "2 unreadable gallery image(s) skipped" in r.output, r.output
    # the JSON says the same: each skipped gallery image with its reason, strict JSON on stdout
    r = cli.invoke(app, ["infer", str(digits_val10 / "7"), "-m", str(emb_onnx), "--gallery", str(g), "--json", "-"])
    assert r.exit_code == 3, r.output
    doc = json.loads(r.stdout)
    assert sorted(Path(s["path"]).name for s in doc["gallery"]["skipped"]) == ["broken.png", "empty.png"]
    assert doc["gallery"]["images"] == 100 and len(doc["embeddings"]) == 10


def test_infer_gallery_all_readable_is_done(emb_onnx: Path, digits_val10: Path) -> None:
    r = cli.invoke(app, ["infer", str(digits_val10 / "7"), "-m", str(emb_onnx), "--gallery", str(digits_val10),
                         "--json", "-"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["gallery"]["skipped"] == []
