"""Issue 37, P11: what a command says is true and its own, and a usage error comes before the work.

Each test here failed on main (12583f9): export misread a NaN or negative LayerNorm epsilon as an opset ONNX Runtime
cannot load, after ONNX Runtime's own red log lines; importing NNCF let torch log "No CUDA runtime is found"; an
explicit --smooth was silently ignored by --quantizer nncf; --versus nncf ran an OpenVINO row under --backends
onnxruntime. (explain --json without --compare: tests/test_explain.py; a CPU bundle's closing line:
tests/test_bundle_embedding.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vitdeploy.core.errors import UsageError, VitdeployError

# A graph ONNX Runtime refuses at session start (its Add + LayerNormalization fusion, SkipLayerNorm, checks that the
# epsilon is >= 0): the way an exported model with a negative layer_norm_eps failed its parity check.
REFUSED_BY_ORT = """
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from vitdeploy.runners.onnxruntime.loader import session
io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8]) for n in ("x", "z", "y")]
w = [numpy_helper.from_array(np.ones(8, np.float32), n) for n in ("s", "c")]
nodes = [helper.make_node("Add", ["x", "z"], ["a"]),
         helper.make_node("LayerNormalization", ["a", "s", "c"], ["y"], axis=-1, epsilon=-1e-6)]
m = helper.make_model(helper.make_graph(nodes, "g", io[:2], io[2:], w), opset_imports=[helper.make_opsetid("", 17)])
try:
    session(m)
except Exception as e:
    print(e)
"""


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_a_model_onnxruntime_refuses_is_one_line_of_ours_without_its_log_lines() -> None:
    r = _python(REFUSED_BY_ORT)
    assert "ONNX Runtime cannot load it (Exception during initialization: epsilon_ >= 0 was false.)" in r.stdout, r.stdout
    assert "[E:onnxruntime" not in r.stderr and "\x1b[" not in r.stderr, r.stderr  # its own red ANSI lines


@pytest.mark.parametrize("eps", [float("nan"), -1e-6], ids=["nan", "negative"])
def test_export_names_a_nan_or_negative_norm_epsilon_and_writes_nothing(eps: float, tmp_path: Path) -> None:
    from vitdeploy.core.manifest import Manifest
    from vitdeploy.model.checkpoint import save_checkpoint
    from vitdeploy.model.presets import get_preset
    from vitdeploy.model.vit import VisionTransformer
    from vitdeploy.stages.export import export_onnx

    p = get_preset("vit-digits")
    cfg = p.config.with_(depth=1, ln_eps=eps)
    save_checkpoint(tmp_path / "ckpt.pth", VisionTransformer(cfg).eval(),
                    Manifest(model=cfg.to_dict(), labels=[str(i) for i in range(cfg.num_classes)],
                             preprocess=dict(p.preprocess), name="eps"))
    with pytest.raises(VitdeployError) as e:
        export_onnx(tmp_path / "ckpt.pth", tmp_path / "model.onnx")
    said = str(e.value)
    assert f"is {eps}" in said and "model.ln_eps" in said and ">= 0" in said and "opset" not in said, said
    assert sorted(f.name for f in tmp_path.iterdir()) == ["ckpt.pth"]


def test_nncf_paths_do_not_pass_on_torchs_no_cuda_runtime_line(tmp_path: Path) -> None:
    """NNCF tells a model's backend apart by importing nncf.torch, which imports torch.utils.cpp_extension: with a
    CUDA toolkit and no GPU (CUDA_HOME set here) that logs "No CUDA runtime is found". The control shows the line
    appears on this machine without our import_nncf."""
    pytest.importorskip("nncf")
    probe = ("from nncf.common.utils.backend import get_backend; import onnx; get_backend(onnx.ModelProto()); "
             "import torch; print('gpu' if torch.cuda.is_available() else 'cpu')")
    control = _python(f"import nncf; {probe}", CUDA_HOME=str(tmp_path))
    if control.stdout.strip() == "gpu":
        pytest.skip("a CUDA GPU here: torch logs no such line")
    assert "No CUDA runtime is found" in control.stderr, control.stderr
    ours = _python(f"from vitdeploy.graph.nncf_ptq import import_nncf; import_nncf(); {probe}", CUDA_HOME=str(tmp_path))
    assert ours.returncode == 0 and "No CUDA runtime" not in ours.stderr, ours.stderr


@pytest.mark.parametrize("smooth", ["off", "0.5"])
def test_an_explicit_smooth_with_nncf_is_refused_before_any_work(smooth: str, digits_onnx: Path,
                                                                tmp_path: Path) -> None:
    """NNCF's transformer scheme applies its own SmoothQuant; ours is not applied, so a strength or off asked for
    with --quantizer nncf is refused (exit 2), rather than ignored. auto (the default) means NNCF's own."""
    from vitdeploy.stages.precision import calibrate

    with pytest.raises(UsageError, match=f"--smooth {smooth} is our quantizer's"):
        calibrate(digits_onnx, None, tmp_path / "q.onnx", quantizer="nncf", target="cpu", smooth=smooth)
    assert not list(tmp_path.iterdir())


def test_versus_nncf_respects_backends_without_openvino(digits_onnx: Path) -> None:
    """NNCF's INT8 row runs on OpenVINO: under --backends onnxruntime it is refused in one line before any work, not
    measured anyway."""
    from vitdeploy.tools.bench import benchmark

    with pytest.raises(UsageError, match="--backends onnxruntime leaves out"):
        benchmark([digits_onnx], [1], backends=["onnxruntime"], iterations=1, versus="nncf")
