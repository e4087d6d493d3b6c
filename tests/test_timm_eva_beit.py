"""timm's Eva and Beit models (RoPE, relative position bias, q/v bias, LayerScale, registers, SwiGLU) through import
and export, judged by timm's own forward pass on the same weights.

Each model comes two ways, as users save it: a state dict of the registered architecture (full depth) imported with
``--arch``, and a ``save_for_hf`` folder of a 2-block copy (timm records ``depth`` in ``model_args``). Weights are
random and perturbed so that LayerScale gammas, q/v biases and relative position tables (which timm initialises to
constants or zero) are not trivial. The exported graphs must pass ``check-target`` for every TensorRT line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import ort_run, rel_err
from typer.testing import CliRunner

timm = pytest.importorskip("timm")

from vitdeploy.checks import conformance as cf  # noqa: E402
from vitdeploy.cli import app  # noqa: E402
from vitdeploy.model.importers import load_any  # noqa: E402
from vitdeploy.stages.export import export_onnx  # noqa: E402

# `make test` leaves these out (`make test-all` and CI run them): EVA/BEiT built with timm and compared (50 test-s of 920)
pytestmark = pytest.mark.slow

MODELS = ("eva02_tiny_patch14_224", "vit_small_patch16_dinov3", "beit_base_patch16_224")
TOL = 1e-4  # relative to the largest |logit|
N_CLS = 5


def _perturbed(name: str, seed: int, **kwargs: Any) -> Any:
    torch.manual_seed(seed)
    m = timm.create_model(name, pretrained=False, num_classes=N_CLS, **kwargs).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m


def _timm_logits(m: Any, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return np.asarray(m(x).numpy(), np.float32)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Per model: the full-depth timm model and its state dict file; the 2-block model and its save_for_hf folder."""
    from timm.models._hub import save_for_hf

    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(MODELS):
        d = tmp_path_factory.mktemp(name)
        full = _perturbed(name, seed=i)
        torch.save(full.state_dict(), d / "weights.pth")
        small = _perturbed(name, seed=10 + i, depth=2)
        save_for_hf(small, d / "hf")
        out[name] = {"full": full, "sd": d / "weights.pth", "small": small, "hf": d / "hf", "dir": d}
    return out


@pytest.fixture(scope="module")
def exported(saved: dict[str, dict[str, Any]]) -> dict[str, dict[str, Path]]:
    """Each folder exported once as written by default (LayerNormalization: TensorRT 8.6+) and for trt8.5."""
    out: dict[str, dict[str, Path]] = {}
    for name, s in saved.items():
        out[name] = {
            "default": export_onnx(s["hf"], s["dir"] / "model.onnx", check=False).path,
            "trt8.5": export_onnx(s["hf"], s["dir"] / "model85.onnx", check=False, target="trt8.5").path,
        }
    return out


def _input(ck: Any, n: int = 2, seed: int = 0) -> torch.Tensor:
    h, w = ck.manifest.input_size
    return torch.randn(n, 3, h, w, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", MODELS)
def test_state_dict_with_arch_gives_timm_logits(saved: dict[str, dict[str, Any]], name: str) -> None:
    s = saved[name]
    ck = load_any(s["sd"], arch=name)
    x = _input(ck, n=1)
    with torch.no_grad():
        ours = ck.build()(x).numpy()
    ref = _timm_logits(s["full"], x)
    assert rel_err(ours, ref) < TOL, (name, rel_err(ours, ref))
    assert ck.manifest.model["depth"] == s["full"].blocks.__len__()
    # and the exported ONNX of the full-size state dict, as `vitdeploy export weights.pth --arch NAME` writes it
    onnx_path = export_onnx(s["sd"], s["dir"] / "arch.onnx", check=False, arch=name).path
    err = rel_err(ort_run(onnx_path, x.numpy()), ref)
    print(f"{name} --arch (full size) ONNX: max rel. diff to timm {err:.2e}")
    assert err < TOL, (name, err)


@pytest.mark.parametrize("name", MODELS)
def test_save_for_hf_folder_exports_timm_logits_for_every_tensorrt(
    saved: dict[str, dict[str, Any]], exported: dict[str, dict[str, Path]], name: str
) -> None:
    s = saved[name]
    ck = load_any(s["hf"])
    assert ck.manifest.model["depth"] == 2  # from the folder's model_args, not the name
    x = _input(ck, n=3, seed=1)
    ref = _timm_logits(s["small"], x)
    for path in exported[name].values():
        err = rel_err(ort_run(path, x.numpy()), ref)
        print(f"{name} {path.name}: max rel. diff to timm {err:.2e}")
        assert err < TOL, (name, path.name, err)
    for target in ("trt8.6", "trt10", "trt11"):
        rep = cf.check_onnx(exported[name]["default"], target)
        assert rep.ok, rep.summary()
    rep = cf.check_onnx(exported[name]["trt8.5"], "trt8.5")
    assert rep.ok, rep.summary()


def test_exported_attention_keeps_tensorrts_fusion_pattern(exported: dict[str, dict[str, Path]]) -> None:
    """RoPE is elementwise on constants before the scaled MatMul; the relative bias is one constant Add before Softmax;
    Softmax feeds the second MatMul directly."""
    import onnx
    from onnx import numpy_helper

    for name in ("vit_small_patch16_dinov3", "beit_base_patch16_224"):
        g = onnx.load(str(exported[name]["default"])).graph
        consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        producer = {o: n for n in g.node for o in n.output}
        users: dict[str, list[Any]] = {}
        for n in g.node:
            for i in n.input:
                users.setdefault(i, []).append(n)
        softmaxes = [n for n in g.node if n.op_type == "Softmax"]
        assert len(softmaxes) == 2
        for sm in softmaxes:
            assert [u.op_type for u in users[sm.output[0]]] == ["MatMul"]
            before = producer[sm.input[0]]
            if name.startswith("beit"):
                assert before.op_type == "Add"
                bias = next(i for i in before.input if i in consts)
                assert consts[bias].shape == (1, 12, 197, 197)
                before = producer[next(i for i in before.input if i not in consts)]
            assert before.op_type == "MatMul"
            q = producer[before.input[0]]
            assert q.op_type == "Mul" and consts[q.input[1]].size == 1  # the scale, on Q
        if name.endswith("dinov3"):
            gathers = [n for n in g.node if n.op_type == "Gather" and n.input[1] in consts and consts[n.input[1]].size == 64]
            assert len(gathers) == 4  # q and k of each block: the rotation's partner channels


@pytest.mark.parametrize(
    ("name", "size"), [("vit_medium_patch16_rope_reg1_gap_256", 160), ("vit_small_patch16_dinov3", 192)]
)
def test_rope_model_at_another_size_equals_timm_built_there(name: str, size: int, tmp_path: Path) -> None:
    """timm's img_size= (SBB RoPE: tables rescaled onto ref_feat_shape) or a data config of another size (DINOv3 is
    dynamic): the imported model gets tables for the new grid and timm's logits there."""
    from timm.models._hub import save_for_hf

    m = _perturbed(name, seed=5, depth=2, img_size=size)
    save_for_hf(m, tmp_path / "hf", data_config={"input_size": (3, size, size)})
    ck = load_any(tmp_path / "hf")
    assert ck.manifest.input_size == (size, size)
    model = ck.build()
    x = _input(ck)
    with torch.no_grad():
        ours = model(x).numpy()
    err = rel_err(ours, _timm_logits(m, x))
    print(f"{name} at {size}: max rel. diff to timm {err:.2e}")
    assert err < TOL
    assert model.rope_sin is not None and model.rope_sin.shape[0] == (size // 16) ** 2 + model.cfg.num_prefix_tokens


def test_the_name_table_is_what_timm_registers() -> None:
    """vitdeploy/model/timm_archs.json is generated, not typed: it equals what the script reads from the installed
    timm, for every family it records (vision_transformer, deit, eva, beit and the hybrids)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import gen_timm_archs
    finally:
        sys.path.pop(0)
    from vitdeploy.model.timm_import import ARCHS_FILE

    table = json.loads(ARCHS_FILE.read_text())
    if table["timm_version"] != timm.__version__:
        pytest.skip(f"table read from timm {table['timm_version']}, installed {timm.__version__}")
    assert {"vision_transformer", "deit", "eva", "beit"} <= {e["family"] for e in table["archs"].values()}
    assert table == json.loads(gen_timm_archs.dumps(gen_timm_archs.table()))


def test_an_eva_feature_vitdeploy_lacks_is_one_line_naming_it(saved: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["import", str(saved[MODELS[0]]["sd"]), "--arch", "eva02_base_patch16_clip_224",
                                 "-o", str(tmp_path / "ckpt.pth")])
    assert r.exit_code == 1, r.output
    assert "scale_attn_inner" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "ckpt.pth").exists()


def test_weights_of_another_depth_are_one_line_naming_the_difference(saved: dict[str, dict[str, Any]]) -> None:
    from vitdeploy.core.errors import VitdeployError

    with pytest.raises(VitdeployError, match="do not fit the architecture.*missing blocks.2"):
        load_any(saved["beit_base_patch16_224"]["hf"] / "pytorch_model.bin", arch="beit_base_patch16_224")
