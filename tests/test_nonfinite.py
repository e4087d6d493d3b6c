"""Finite numbers are part of parity: a model whose logits hold NaN or Inf fails every check, in one line naming how
many images gave them, and JSON stays strict JSON (a NaN's argmax is class 0, so it used to 'agree' on class 0)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from vitdeploy.checks.metrics import compare, top_k_accuracy

VENV_BIN = Path(sys.executable).parent


def vitdeploy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "vitdeploy"), *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def strict_loads(text: str) -> object:
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON"))


def nan_model(src: Path, dst: Path) -> Path:
    """``src`` with its logits multiplied by NaN: the same manifest, input and output, every logit NaN."""
    m = onnx.load(str(src))
    out = m.graph.output[0].name
    for node in m.graph.node:
        node.output[:] = [f"{o}_pre_nan" if o == out else o for o in node.output]
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.array(np.nan, np.float32), "nan_scale"))
    m.graph.node.append(helper.make_node("Mul", [f"{out}_pre_nan", "nan_scale"], [out]))
    onnx.save(m, str(dst))
    return dst


@pytest.fixture(scope="module")
def work(digits_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight vit-digits checkpoint (finite logits need no training), its ONNX and a NaN copy of it."""
    from vitdeploy.stages.export import export_onnx
    from vitdeploy.tools.bench import _random_checkpoint

    d = tmp_path_factory.mktemp("nonfinite")
    _random_checkpoint("vit-digits", d, seed=0)
    export_onnx(d / "ckpt.pth", d / "model.onnx", check=False)
    nan_model(d / "model.onnx", d / "nan.onnx")
    (d / "zeros").mkdir()  # images of class 0 only: where a NaN argmax (0) used to agree
    for i, f in enumerate(sorted((digits_folder / "val" / "0").glob("*.png"))[:4]):
        shutil.copy(f, d / "zeros" / f"z{i}.png")
    return d


def test_compare_counts_nonfinite_rows_and_never_passes() -> None:
    ref = np.array([[5.0, 1.0, 0.0], [4.0, 0.0, 1.0], [3.0, 2.0, 1.0]])
    cand = ref.copy()
    cand[1, 2] = np.nan
    cand[2, 0] = np.inf
    c = compare(ref, cand)
    assert c.nonfinite == 2 and not c.finite
    assert not c.within(1e9)  # no tolerance is loose enough
    assert c.agreement == pytest.approx(1 / 3)
    assert "2 of 3 images" in (c.nonfinite_message() or "")
    labels = np.zeros(3, int)
    assert top_k_accuracy(np.full((3, 3), np.nan), labels) == 0.0  # NaN's argmax is 0: never a correct answer
    assert top_k_accuracy(np.full((3, 3), np.nan), labels, k=2) == 0.0


def test_verify_fails_a_nan_candidate_in_one_line_and_writes_strict_json(work: Path) -> None:
    r = vitdeploy("verify", "model.onnx", "nan.onnx", "--images", "zeros", "--json", "v.json", cwd=work)
    assert r.returncode == 1, r.stdout + r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "NaN or Inf logits on 4 of 4 images" in err[0], r.stderr
    doc = strict_loads((work / "v.json").read_text())
    assert isinstance(doc, dict) and doc["passed"] is False
    r2 = vitdeploy("verify", "model.onnx", "nan.onnx", "--images", "zeros", "--json", "-", cwd=work)
    assert strict_loads(r2.stdout)["passed"] is False  # type: ignore[index]


def test_infer_names_the_images_a_model_gave_nan_for(work: Path) -> None:
    r = vitdeploy("infer", "zeros", "--model", "nan.onnx", "-o", "p.json", cwd=work)
    assert r.returncode == 1, r.stdout + r.stderr  # no image could be classified
    assert "NaN or Inf" in r.stderr and "Traceback" not in r.stderr
    assert not (work / "p.json").exists()


def test_export_parity_fails_on_a_nan_onnx_model(work: Path) -> None:
    from vitdeploy.checks.parity import check_parity

    rep = check_parity(work / "ckpt.pth", work / "nan.onnx", images=work / "zeros", batch_sizes=(1, 2))
    assert not rep.passed
    assert "NaN or Inf" in rep.failures[0].describe()


def test_bundle_refuses_a_nan_model_and_writes_nothing(work: Path) -> None:
    r = vitdeploy("bundle", "nan.onnx", "-o", "b", "--check-images", "zeros", "--references", "2", cwd=work)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "NaN or Inf" in r.stderr and len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr
    assert not (work / "b").exists()
    assert not [p for p in work.iterdir() if p.name.startswith(".b")]


def test_the_calibrate_guard_counts_a_nan_int8_model_wrong_on_every_image() -> None:
    from vitdeploy.checks.guard import figures

    ref = np.zeros((4, 3))
    ref[:, 0] = 5.0  # class 0 everywhere: where NaN's argmax (0) used to agree and count as correct
    f = figures(ref, np.full((4, 3), np.nan), np.zeros(4, int))
    assert f.fp32_top1 == 1.0 and f.int8_top1 == 0.0 and f.agreement == 0.0 and f.drop_points == 100.0
