"""vitdeploy verify: accuracy, agreement and logit differences between artifacts on real images."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from typer.testing import CliRunner

from vitdeploy.checks.verify import DEFAULT_TOLERANCES, Tolerance, compare, default_tolerance, verify
from vitdeploy.cli import app
from vitdeploy.core.artifact import read_onnx_manifest
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.manifest import set_onnx_manifest
from vitdeploy.model.checkpoint import save_checkpoint
from vitdeploy.model.importers import load_any

cli = CliRunner()
KEYS = {"artifact", "top1", "agreement", "max_abs_diff", "mean_abs_diff", "max_abs_logit", "cosine"}


@pytest.fixture
def small_val(digits_val10: Path) -> Path:
    """10 images per class of the digits val split (tests/conftest.py)."""
    return digits_val10


def make_ckpt(path: Path, num_classes: int, image_size: int = 32) -> Path:
    """A randomly initialised vit-digits-shaped checkpoint."""
    from vitdeploy.core.manifest import Manifest
    from vitdeploy.model.vit import VisionTransformer, get_preset

    p = get_preset("vit-digits")
    cfg = p.config.with_(num_classes=num_classes, image_size=(image_size, image_size))
    pp = dict(p.preprocess, input_size=[image_size, image_size])
    man = Manifest(model=cfg.to_dict(), labels=[str(i) for i in range(num_classes)], preprocess=pp, name="vit-digits")
    return save_checkpoint(path, VisionTransformer(cfg).eval(), man)


def perturbed_ckpt(src: Path, out: Path, scale: float) -> Path:
    """The same model with every weight nudged: a real artifact that answers slightly differently."""
    ck = load_any(src)
    model = ck.build()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return save_checkpoint(out, model, ck.manifest)


def test_verify_ckpt_and_onnx_on_digits_val(digits_ckpt: Path, digits_onnx: Path, digits_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "v.json"
    res = cli.invoke(app, ["verify", str(digits_ckpt), str(digits_onnx), "--images", str(digits_folder / "val"), "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    ref, onnx_r = data["results"]
    assert KEYS <= set(ref) and KEYS <= set(onnx_r)
    assert ref["artifact"] == str(digits_ckpt) and onnx_r["artifact"] == str(digits_onnx)
    assert data["num_images"] == 360 and data["labeled"] is True
    assert ref["top1"] == onnx_r["top1"] and ref["top1"] > 0.3  # equal accuracy, of a trained model (chance: 0.1)
    assert ref["top5"] == onnx_r["top5"]
    assert onnx_r["agreement"] == 1.0 and onnx_r["passed"] is True
    assert onnx_r["max_abs_diff"] <= 1e-4 * max(1.0, ref["max_abs_logit"])
    assert onnx_r["cosine"] > 0.999999
    assert ref["max_abs_diff"] == 0.0 and ref["agreement"] == 1.0
    for word in ("top-1", "top-5", "agreement", "cosine", "ref", "ok"):
        assert word in res.stdout, word


def test_verify_report_keeps_logits_for_reports(digits_ckpt: Path, digits_onnx: Path, small_val: Path) -> None:
    rep = verify(digits_ckpt, [digits_onnx], small_val, batch_size=16)
    assert rep.passed and len(rep.paths) == 100 and rep.class_labels == [str(i) for i in range(10)]
    assert rep.labels is not None and list(np.bincount(rep.labels)) == [10] * 10
    for r in rep.results:
        assert r.logits.shape == (100, 10) and r.logits.dtype == np.float32
        assert (r.predictions == r.logits.argmax(1)).all()
    # labels come from the folder names, in the order of the paths
    assert all(Path(p).parent.name == rep.class_labels[y] for p, y in zip(rep.paths, rep.labels, strict=True))
    # the reference's own accuracy, recomputed from its logits
    assert rep.reference.top1 == pytest.approx(float((rep.reference.predictions == rep.labels).mean()))
    assert rep.candidates[0].tolerance == DEFAULT_TOLERANCES["fp32"]


def test_flat_folder_gives_agreement_only(digits_ckpt: Path, digits_onnx: Path, small_val: Path, tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    flat.mkdir()
    for f in sorted(small_val.rglob("*.png"))[:20]:
        shutil.copy(f, flat / f"{f.parent.name}_{f.name}")
    out = tmp_path / "v.json"
    res = cli.invoke(app, ["verify", str(digits_ckpt), str(digits_onnx), "-i", str(flat), "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert [r["top1"] for r in data["results"]] == [None, None]
    assert data["results"][1]["agreement"] == 1.0 and "top-1" not in res.stdout


def test_unreadable_files_are_listed_and_skipped(digits_ckpt: Path, digits_onnx: Path, small_val: Path, tmp_path: Path) -> None:
    root = tmp_path / ("a-folder-with-a-long-name-" * 4) / "imgs"  # a path longer than a terminal's 80 columns
    shutil.copytree(small_val, root)
    (root / "3" / "empty.png").write_bytes(b"")
    (root / "7" / "junk.jpg").write_bytes(b"not an image at all")
    good = next((root / "5").iterdir())
    (root / "5" / "cut.png").write_bytes(good.read_bytes()[:40])
    out = tmp_path / "v.json"
    res = cli.invoke(app, ["verify", str(digits_ckpt), str(digits_onnx), "-i", str(root), "--json", str(out)])
    assert res.exit_code == 3, res.output  # partly done: the rest is measured
    for name in ("3/empty.png", "7/junk.jpg", "5/cut.png"):  # each named on one line, the path never split
        assert any(line.startswith(f"skipped {root / name}: ") for line in res.stderr.splitlines()), res.stderr
    data = json.loads(out.read_text())
    assert data["num_images"] == 100 and len(data["skipped"]) == 3
    assert data["results"][1]["agreement"] == 1.0


def test_candidate_outside_tolerance_fails(digits_ckpt: Path, small_val: Path, tmp_path: Path) -> None:
    other = perturbed_ckpt(digits_ckpt, tmp_path / "nudged.pth", 1e-3)
    out = tmp_path / "v.json"
    res = cli.invoke(app, ["verify", str(digits_ckpt), str(other), "-i", str(small_val), "--json", str(out)])
    assert res.exit_code == 1, res.output
    assert "outside tolerance" in res.stderr and "max |Δlogit|" in res.stderr
    data = json.loads(out.read_text())  # the JSON is written all the same
    r = data["results"][1]
    assert r["passed"] is False and r["max_abs_diff"] > 1e-4 * max(1.0, data["results"][0]["max_abs_logit"])
    # a looser tolerance passes the same artifact
    res = cli.invoke(app, ["verify", str(digits_ckpt), str(other), "-i", str(small_val), "--tolerance", "rtol=none,agreement=0.5"])
    assert res.exit_code == 0, res.output


def test_precision_picks_the_default_tolerance(digits_ckpt: Path, digits_onnx: Path, small_val: Path, tmp_path: Path) -> None:
    """An ONNX labelled int8 gets the int8 rule (agreement ≥ 99%, no logit bound)."""
    m = onnx.load(str(digits_onnx))
    set_onnx_manifest(m, read_onnx_manifest(digits_onnx).derive(precision="int8"))
    # nudge the head bias so logits move but no top-1 does on these images
    for t in m.graph.initializer:
        if onnx.numpy_helper.to_array(t).shape == (10,) and t.name.startswith("head"):
            t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t) + np.float32(1e-3), t.name))
            break
    else:
        pytest.fail("no head bias initializer")
    int8 = tmp_path / "model.int8.onnx"
    onnx.save(m, str(int8))
    rep = verify(digits_ckpt, [digits_onnx, int8], small_val)
    fp32_r, int8_r = rep.candidates
    assert fp32_r.tolerance == default_tolerance("fp32") and int8_r.tolerance == default_tolerance("int8")
    assert int8_r.precision == "int8" and int8_r.max_abs_diff > 5e-4 and int8_r.passed
    rep = verify(digits_ckpt, [int8], small_val, tolerance="1e-4")
    assert not rep.passed and "max |Δlogit|" in rep.failures[0]


def test_compare_thresholds_per_precision() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1000, 10)).astype(np.float32) * 5
    lab = ref.argmax(1)
    swapped = ref.copy()
    # make exactly 5 of 1000 images (0.5%) disagree
    idx = np.arange(5)
    swapped[idx, lab[idx]] = -100
    for prec, ok in (("fp32", False), ("fp16", False), ("int8", True)):
        r = compare("c", swapped, ref, lab, default_tolerance(prec))
        assert r.agreement == pytest.approx(0.995) and r.passed is ok, prec
    tiny = ref + np.float32(1e-4)
    assert compare("c", tiny, ref, lab, default_tolerance("fp32")).passed  # 1e-4 ≤ 1e-4 × max|logit|
    fp16_like = ref + rng.standard_normal(ref.shape).astype(np.float32) * 1e-3
    r16 = compare("c", fp16_like, ref, lab, default_tolerance("fp16"))
    assert r16.passed == (r16.agreement >= 0.999)
    assert not compare("c", fp16_like, ref, lab, default_tolerance("fp32")).passed
    r = compare("ref", ref, ref, lab, None)
    assert r.top1 == 1.0 and r.top5 == 1.0 and r.cosine == pytest.approx(1.0) and r.max_abs_diff == 0.0


def test_tolerance_parse() -> None:
    assert Tolerance.parse("1e-3") == Tolerance(1e-3, 1.0)
    assert Tolerance.parse("rtol=1e-2,agreement=0.999") == Tolerance(1e-2, 0.999)
    assert Tolerance.parse("agreement=99%") == Tolerance(None, 0.99)
    assert Tolerance.parse("rtol=none,agreement=0") == Tolerance(None, 0.0)
    for bad in ("abc", "speed=3", "agreement=2"):
        with pytest.raises(UsageError):
            Tolerance.parse(bad)


def test_incompatible_artifacts_name_both(digits_ckpt: Path, small_val: Path, tmp_path: Path) -> None:
    five = make_ckpt(tmp_path / "five.pth", num_classes=5)
    big = make_ckpt(tmp_path / "big.pth", num_classes=10, image_size=64)
    for other, words in ((five, ["5 classes", "10"]), (big, ["64x64", "32x32"])):
        res = cli.invoke(app, ["verify", str(digits_ckpt), str(other), "-i", str(small_val)])
        assert res.exit_code == 1, res.output
        err = res.stderr.strip().splitlines()
        assert len(err) == 1 and str(other) in err[0] and str(digits_ckpt) in err[0], err
        for w in words:
            assert w in err[0]
    with pytest.raises(VitdeployError, match="no such folder"):
        verify(digits_ckpt, [digits_ckpt], tmp_path / "nope")
    res = cli.invoke(app, ["verify", str(digits_ckpt), str(tmp_path / "missing.onnx"), "-i", str(small_val)])
    assert res.exit_code == 1 and "missing.onnx" in res.stderr
