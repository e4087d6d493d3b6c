"""Attention maps: the rollout against an independent hand computation, and PNGs from real images."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from vitdeploy.cli import app
from vitdeploy.model.vit import VisionTransformer, ViTConfig
from vitdeploy.tools.explain import attention_map, explain, last_layer, output_names, png_size, render, rollout

runner = CliRunner()


# --- an independent numpy ViT forward and rollout, written from the paper, loops where it helps reading ---


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _hand_attentions(sd: dict[str, np.ndarray], cfg: ViTConfig, img: np.ndarray) -> list[np.ndarray]:
    """Per block [heads, N, N] softmax(q k^T / sqrt(d)) for one CHW image, from the raw weights."""
    p, d, h = cfg.patch_size, cfg.embed_dim, cfg.num_heads
    gh, gw = cfg.grid_size
    tokens = [sd["cls_token"][0, 0]]
    for r in range(gh):
        for c in range(gw):
            patch = img[:, r * p : (r + 1) * p, c * p : (c + 1) * p]
            w = sd["patch_embed.proj.weight"]  # [d, C, p, p]
            tokens.append(np.array([(w[k] * patch).sum() for k in range(d)]) + sd["patch_embed.proj.bias"])
    x = np.stack(tokens) + sd["pos_embed"][0]
    out = []
    hd = d // h
    for i in range(cfg.depth):
        pre = f"blocks.{i}."
        y = _layer_norm(x, sd[pre + "norm1.weight"], sd[pre + "norm1.bias"], cfg.ln_eps)
        qkv = y @ sd[pre + "attn.qkv.weight"].T + sd[pre + "attn.qkv.bias"]
        q, k, v = qkv[:, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :]
        probs = np.zeros((h, len(x), len(x)))
        heads = []
        for j in range(h):
            s = q[:, j * hd : (j + 1) * hd] @ k[:, j * hd : (j + 1) * hd].T / math.sqrt(hd)
            e = np.exp(s - s.max(axis=1, keepdims=True))
            probs[j] = e / e.sum(axis=1, keepdims=True)
            heads.append(probs[j] @ v[:, j * hd : (j + 1) * hd])
        x = x + np.concatenate(heads, axis=1) @ sd[pre + "attn.proj.weight"].T + sd[pre + "attn.proj.bias"]
        y = _layer_norm(x, sd[pre + "norm2.weight"], sd[pre + "norm2.bias"], cfg.ln_eps)
        y = _gelu(y @ sd[pre + "mlp.fc1.weight"].T + sd[pre + "mlp.fc1.bias"])
        x = x + y @ sd[pre + "mlp.fc2.weight"].T + sd[pre + "mlp.fc2.bias"]
        out.append(probs)
    return out


def _hand_rollout(layers: list[np.ndarray], fusion: str, discard: float, pool: str) -> np.ndarray:
    """Abnar & Zuidema: per block fuse heads, drop the weakest weights, add I, renormalise rows; multiply up."""
    n = layers[0].shape[-1]
    flow = np.eye(n)
    for probs in layers:
        fused = {"mean": np.mean, "max": np.max, "min": np.min}[fusion](probs, axis=0)
        values = sorted((fused[r, c], r * n + c) for r in range(n) for c in range(n))
        for _, flat in values[: int(n * n * discard)]:
            if flat != 0:
                fused[flat // n, flat % n] = 0.0
        a = fused + np.eye(n)
        for r in range(n):
            a[r] = a[r] / a[r].sum()
        flow = a @ flow
    if pool == "cls":
        return flow[0, 1:]
    return np.array([sum(flow[r, c] for r in range(1, n)) / (n - 1) for c in range(1, n)])


def _tiny_model(pool: str) -> tuple[VisionTransformer, ViTConfig]:
    """A 2-block, 2-head ViT on 8x8 images (4 patches) with fixed, non-random weights."""
    cfg = ViTConfig(image_size=(8, 8), patch_size=4, embed_dim=8, depth=2, num_heads=2, mlp_ratio=2.0,
                    num_classes=3, pool=pool)
    model = VisionTransformer(cfg).eval()
    with torch.no_grad():
        for i, (_, t) in enumerate(sorted(model.named_parameters())):
            idx = torch.arange(t.numel(), dtype=torch.float64).reshape(t.shape)
            t.copy_((0.6 * torch.sin(1.7 * idx + 0.9 * i) + 0.1 * torch.cos(0.3 * idx * (i + 1))).float())
    return model, cfg


@pytest.mark.parametrize("pool", ["cls", "mean"])
@pytest.mark.parametrize(("fusion", "discard"), [("mean", 0.0), ("max", 0.0), ("min", 0.0), ("mean", 0.5), ("max", 0.9)])
def test_rollout_matches_hand_computation_on_tiny_model(pool: str, fusion: str, discard: float) -> None:
    model, cfg = _tiny_model(pool)
    img = np.stack([np.outer(np.linspace(-1, 1, 8), np.cos(np.arange(8) * (c + 1))) for c in range(3)]).astype(np.float32)
    sd = {k: v.double().numpy() for k, v in model.state_dict().items()}
    hand_attn = _hand_attentions(sd, cfg, img.astype(np.float64))
    with torch.no_grad():
        logits, attns = model.forward_with_attention(torch.from_numpy(img)[None])
        plain = model(torch.from_numpy(img)[None])
    assert len(attns) == 2 and tuple(attns[0].shape) == (1, 2, 5, 5)
    for mine, hand in zip(attns, hand_attn, strict=True):
        np.testing.assert_allclose(mine[0].numpy(), hand, atol=1e-5)
    # the attention path gives the same logits as the normal (fused-kernel) path
    np.testing.assert_allclose(logits.numpy(), plain.numpy(), atol=1e-5)

    got = rollout([a.numpy() for a in attns], fusion, discard, pool)[0]
    want = _hand_rollout(hand_attn, fusion, discard, pool)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert np.ptp(want) > 1e-4  # the fixed weights give a map worth comparing


def test_rollout_by_hand_on_written_numbers() -> None:
    # one head, CLS + 2 patches; block 1: CLS attends only to patch 2; block 2: everyone attends to itself
    a1 = np.array([[[[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]]])
    a2 = np.eye(3)[None, None]
    # block 1 with I, rows renormalised: CLS row [0.5, 0, 0.5]; block 2: (I + I)/2 = I
    np.testing.assert_allclose(rollout([a1, a2]), [[0.0, 0.5]])
    # mean pool: patch rows of block 1 are [0, 1, 0] and [0, 0, 1] → column means [0.5, 0.5]
    np.testing.assert_allclose(rollout([a1, a2], pool="mean"), [[0.5, 0.5]])
    # order matters: a3 moves patch 1 into patch 2. Flow = A_last' ... A_first'.
    a3 = np.array([[[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]]])
    # a1 then a3: CLS row of A3' is [1, 0, 0], so the flow is A1's CLS row [0.5, 0, 0.5]
    np.testing.assert_allclose(rollout([a1, a3]), [[0.0, 0.5]])
    # a3 then a1: [0.5, 0, 0.5] @ A3' (p2 row [0, 0.5, 0.5]) = [0.5, 0.25, 0.25]
    np.testing.assert_allclose(rollout([a3, a1]), [[0.25, 0.25]])
    np.testing.assert_allclose(last_layer([a3, a1]), [[0.0, 1.0]])
    np.testing.assert_allclose(last_layer([a3, a1], pool="mean"), [[0.5, 0.5]])


def test_attention_map_orientation_and_scaling() -> None:
    # 2x3 grid; the CLS token attends to the patch at row 0, column 2 only
    n = 7
    a = np.full((1, 1, n, n), 1.0 / n)
    a[0, 0, 0] = 0.0
    a[0, 0, 0, 1 + 2] = 1.0
    m = attention_map([a], (2, 3), method="last-layer")[0]
    assert m.shape == (2, 3) and m[0, 2] == 1.0 and m.min() == 0.0
    assert np.unravel_index(np.argmax(attention_map([a], (2, 3))[0]), (2, 3)) == (0, 2)
    # a constant map stays 0 rather than dividing by zero
    assert not attention_map([np.full((1, 1, n, n), 1.0 / n)], (2, 3)).any()
    # drawn: the hot patch is at the top right of the overlay panel
    img = Image.new("RGB", (48, 32), (128, 128, 128))
    png = render(img, m, [("a", 0.9)])
    assert png.size == png_size((32, 48))
    heat = _heat_from_image(np.asarray(png, np.float64), (32, 48))
    h, w = heat.shape[:2]
    top_right, bottom_left = heat[: h // 4, -w // 6 :].mean((0, 1)), heat[-h // 4 :, : w // 6].mean((0, 1))
    assert top_right[0] > 100 and top_right[2] < 50  # jet's hot end: red
    assert bottom_left[2] > 100 and bottom_left[0] < 50  # jet's cold end: blue


def test_output_names_keep_inputs_apart(tmp_path: Path) -> None:
    paths = [Path("val/3/img1.png"), Path("val/5/img1.png"), Path("x/cat.jpg")]
    names = [p.name for p in output_names(paths, tmp_path)]
    assert names == ["3_img1.attention.png", "5_img1.attention.png", "cat.attention.png"]
    assert len({p.name for p in output_names([Path("a.png"), Path("a.png")], tmp_path)}) == 2


def _heat_from_image(a: np.ndarray, input_size: tuple[int, int]) -> np.ndarray:
    """The heat colours recovered from a drawn PNG: overlay = (1-α)·image + α·heat."""
    from vitdeploy.tools.explain import ALPHA, MARGIN, panel_size

    pw, ph = panel_size(input_size)
    shown = a[MARGIN : MARGIN + ph, MARGIN : MARGIN + pw]
    over = a[MARGIN : MARGIN + ph, 2 * MARGIN + pw : 2 * MARGIN + 2 * pw]
    return (over - (1 - ALPHA) * shown) / ALPHA


def _heat_from_png(png: Path, input_size: tuple[int, int]) -> np.ndarray:
    return _heat_from_image(np.asarray(Image.open(png).convert("RGB"), np.float64), input_size)


def test_explain_cli_on_digits_and_a_photo(digits_ckpt: Path, digits_folder: Path, photo_files: list[Path],
                                           tmp_path: Path) -> None:
    digits = [digits_folder / "val" / str(c) / sorted(p.name for p in (digits_folder / "val" / str(c)).iterdir())[0]
              for c in (0, 3, 7)]
    photo = photo_files[0]  # astronaut.jpg, 512x512
    out = tmp_path / "maps"
    res = runner.invoke(app, ["explain", *map(str, digits), str(photo), "--model", str(digits_ckpt), "-o", str(out)])
    assert res.exit_code == 0, res.output
    pngs = sorted(out.glob("*.attention.png"))
    assert len(pngs) == 4
    assert (out / "astronaut.attention.png").exists()
    for p in pngs:
        with Image.open(p) as im:
            assert im.format == "PNG" and im.size == png_size((32, 32))
        heat = _heat_from_png(p, (32, 32))
        # the recovered heat colours vary over the panel: not a constant map
        assert heat.std(axis=(0, 1)).max() > 20, p
    assert "4 attention map(s)" in res.stdout


def test_explain_library_maps_and_options(digits_ckpt: Path, digits_folder: Path, photo_files: list[Path],
                                          tmp_path: Path) -> None:
    imgs = sorted((digits_folder / "val" / "4").iterdir())[:2] + [photo_files[2]]
    for method in ("rollout", "last-layer"):
        for fusion in ("mean", "max", "min"):
            r = explain(imgs, model=digits_ckpt, out_dir=tmp_path / method / fusion, method=method,
                        head_fusion=fusion, discard_ratio=0.5 if fusion == "max" else 0.0)
            assert len(r.explanations) == 3 and not r.skipped
            for ex in r.explanations:
                assert ex.heatmap.shape == (8, 8) and ex.heatmap.max() == 1.0 and ex.heatmap.std() > 0.01
                assert ex.output.exists() and len(ex.top) == 3
                assert ex.top[0][1] >= ex.top[1][1] >= ex.top[2][1]
    # the caption's predictions are the model's, as the one Runner path computes them
    from vitdeploy.core.preprocess import preprocess_file
    from vitdeploy.runners import open_runner

    with open_runner(digits_ckpt) as run:
        logits = run(np.stack([preprocess_file(p, run.manifest.pp()) for p in imgs]))
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        for ex, row in zip(r.explanations, probs, strict=True):
            assert ex.top[0][0] == run.manifest.labels[int(row.argmax())]
            assert abs(ex.top[0][1] - float(row.max())) < 1e-4
    # the two methods give different maps
    a = explain(imgs[:1], model=digits_ckpt, out_dir=tmp_path / "a").explanations[0].heatmap
    b = explain(imgs[:1], model=digits_ckpt, out_dir=tmp_path / "b", method="last-layer").explanations[0].heatmap
    assert not np.allclose(a, b)


def test_explain_mean_pooled_model_on_a_photo(photo_files: list[Path], tmp_path: Path) -> None:
    from vitdeploy.core.manifest import Manifest
    from vitdeploy.model.checkpoint import save_checkpoint

    cfg = ViTConfig(image_size=(48, 64), patch_size=16, embed_dim=32, depth=2, num_heads=2, num_classes=4, pool="mean")
    torch.manual_seed(0)
    model = VisionTransformer(cfg).eval()
    pp = {"input_size": [48, 64], "resize_mode": "shorter", "crop_pct": 0.875, "interpolation": "bicubic",
          "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "channel_order": "RGB"}
    ckpt = save_checkpoint(tmp_path / "mean.pth", model, Manifest(cfg.to_dict(), ["a", "b", "c", "d"], pp))
    r = explain([photo_files[1]], model=ckpt, out_dir=tmp_path / "o")
    ex = r.explanations[0]
    assert ex.heatmap.shape == (3, 4) and ex.heatmap.std() > 0
    with Image.open(ex.output) as im:
        assert im.size == png_size((48, 64)) and im.size[0] > im.size[1]
    assert {name for name, _ in ex.top} <= {"a", "b", "c", "d"}


def test_explain_unreadable_and_wrong_inputs(digits_ckpt: Path, digits_folder: Path, tmp_path: Path) -> None:
    good = sorted((digits_folder / "val" / "1").iterdir())[0]
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    out = tmp_path / "o"
    res = runner.invoke(app, ["explain", str(good), str(bad), "--model", str(digits_ckpt), "-o", str(out)])
    assert res.exit_code == 3, res.output
    assert "broken.png" in res.stderr and [p.name for p in out.iterdir()] == [f"{good.stem}.attention.png"]

    res = runner.invoke(app, ["explain", str(bad), "--model", str(digits_ckpt), "-o", str(out)])
    assert res.exit_code == 1 and "could be read" in res.stderr

    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"x")
    res = runner.invoke(app, ["explain", str(good), "--model", str(onnx)])
    assert res.exit_code == 1 and "not a readable ONNX model" in res.stderr
    engine = tmp_path / "model.int8.engine"
    engine.write_bytes(b"x")
    res = runner.invoke(app, ["explain", str(good), "--model", str(engine)])
    assert res.exit_code == 2 and "ONNX model it was built from" in res.stderr
    for opt in (["--method", "gradcam"], ["--head-fusion", "median"], ["--discard-ratio", "1.0"]):
        res = runner.invoke(app, ["explain", str(good), "--model", str(digits_ckpt), "-o", str(out), *opt])
        assert res.exit_code == 2, (opt, res.output)
        assert len(res.stderr.strip().splitlines()) == 1
    res = runner.invoke(app, ["explain", str(tmp_path / "nope.png"), "--model", str(digits_ckpt)])
    assert res.exit_code == 1 and "no such file" in res.stderr
    res = runner.invoke(app, ["explain", str(good), "--model", str(digits_ckpt), "-o", str(bad)])
    # an output that cannot be (a file where the maps' folder goes) is refused before any work, as a usage error
    assert res.exit_code == 2 and "is a file: give a folder" in res.stderr and bad.read_bytes().endswith(b"not really")


@pytest.fixture(scope="module")
def onnx_copies(digits_onnx: Path, digits_fp16: Path, digits_int8: Path,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The checkpoint's ONNX export, its FP16 and INT8 (Q/DQ, calibrated on calibration/) copies, a raw-pixel one."""
    from vitdeploy.stages.embed import embed_preprocess

    # uint8 pixels in (NCHW), preprocessing and a final Softmax in the graph
    raw = embed_preprocess(digits_onnx, tmp_path_factory.mktemp("onnx") / "model.raw.onnx", layout="nchw", softmax=True)
    return {"fp32": digits_onnx, "fp16": digits_fp16, "int8": digits_int8, "raw": raw}


def test_explain_onnx_copies_look_where_the_checkpoint_looks(digits_ckpt: Path, digits_folder: Path,
                                                             onnx_copies: dict[str, Path], tmp_path: Path) -> None:
    import onnx

    from vitdeploy.runners.attention import softmax_outputs

    imgs = [sorted((digits_folder / "val" / str(c)).iterdir())[1] for c in range(10)]
    ref = explain(imgs, model=digits_ckpt, out_dir=tmp_path / "ckpt", method="rollout")
    ref_maps = np.stack([e.heatmap for e in ref.explanations])
    limits = {"fp32": 1e-5, "fp16": 5e-3, "int8": 0.1, "raw": 1e-3}
    for prec, path in onnx_copies.items():
        m = onnx.load(str(path))
        assert len(softmax_outputs(m)) == 4  # one per block of vit-digits (not the raw variant's final Softmax)
        if prec == "int8":
            assert any(n.op_type == "QuantizeLinear" for n in m.graph.node)
        r = explain(imgs, model=path, out_dir=tmp_path / prec)
        maps = np.stack([e.heatmap for e in r.explanations])
        diff = float(np.abs(maps - ref_maps).max())
        assert diff < limits[prec], (prec, diff)
        for a, b in zip(maps, ref_maps, strict=True):
            assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.99, prec
        for e, c in zip(r.explanations, ref.explanations, strict=True):
            with Image.open(e.output) as im:
                assert im.size == png_size((32, 32))
            assert e.top[0][0] == c.top[0][0] or prec == "int8"
            if prec in ("fp32", "raw"):  # the caption's scores are the model's own, not a softmax of probabilities
                assert abs(e.top[0][1] - c.top[0][1]) < 1e-3
    # the fp32 export's attention is the checkpoint's: the same numbers, not merely a similar picture
    fp32 = explain(imgs[:2], model=onnx_copies["fp32"], out_dir=tmp_path / "x", method="last-layer", head_fusion="max")
    ck = explain(imgs[:2], model=digits_ckpt, out_dir=tmp_path / "y", method="last-layer", head_fusion="max")
    for a, b in zip(fp32.explanations, ck.explanations, strict=True):
        np.testing.assert_allclose(a.heatmap, b.heatmap, atol=1e-5)
        assert a.top[0][0] == b.top[0][0]


def test_explain_onnx_does_not_import_torch(onnx_copies: dict[str, Path], photo_files: list[Path],
                                            tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from vitdeploy.tools.explain import explain\n"
        f"r = explain([{str(photo_files[3])!r}], model={str(onnx_copies['int8'])!r}, out_dir={str(tmp_path)!r})\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "print(r.explanations[0].output)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert Path(out.stdout.strip()).is_file()


def test_explain_compare_measures_how_closely_copies_follow(digits_ckpt: Path, digits_folder: Path,
                                                            onnx_copies: dict[str, Path], tmp_path: Path) -> None:
    import json

    imgs = [sorted((digits_folder / "val" / str(c)).iterdir())[2] for c in (1, 4, 9)]
    out, js = tmp_path / "maps", tmp_path / "cmp.json"
    res = runner.invoke(app, ["explain", *map(str, imgs), "--model", str(digits_ckpt), "-o", str(out),
                              "--compare", str(onnx_copies["fp32"]), "--compare", str(onnx_copies["int8"]),
                              "--json", str(js)])
    assert res.exit_code == 0, res.output
    doc = json.loads(js.read_text())
    fp32, int8 = doc["results"]
    assert fp32["precision"] == "fp32" and int8["precision"] == "int8" and fp32["images"] == 3
    assert fp32["max_abs_diff"] < 1e-5 and fp32["top1_agreement"] == 1.0 and fp32["min_correlation"] > 0.99999
    assert 0 < int8["max_abs_diff"] < 0.1 and int8["min_correlation"] > 0.99
    assert len(list((out / "model").glob("*.attention.png"))) == 3
    assert len(list((out / "model.int8").glob("*.attention.png"))) == 3
    # --json without --compare is a usage error
    res = runner.invoke(app, ["explain", str(imgs[0]), "--model", str(digits_ckpt), "-o", str(out), "--json", str(js)])
    assert res.exit_code == 2


def test_json_without_compare_is_refused_before_any_map_is_written(digits_ckpt: Path, digits_folder: Path,
                                                                     tmp_path: Path) -> None:
    """--json writes the --compare results only: without --compare it is a usage error, said before the work (issue
    37, P11: it wrote every PNG, then exited 2)."""
    img = sorted((digits_folder / "val" / "1").iterdir())[0]
    out = tmp_path / "maps"
    for js in ("-", str(tmp_path / "cmp.json")):
        res = runner.invoke(app, ["explain", str(img), "--model", str(digits_ckpt), "-o", str(out), "--json", js])
        assert res.exit_code == 2 and "--compare" in res.output, res.output
        assert not out.exists() and not (tmp_path / "cmp.json").exists()


def test_compare_maps_numbers(tmp_path: Path) -> None:
    from vitdeploy.tools.explain import ExplainResult, Explanation, compare_maps

    a = np.array([[0.0, 1.0], [0.5, 0.25]], np.float32)
    b = a.copy()
    b[1, 1] = 0.5
    ref = ExplainResult([Explanation(Path("x.png"), tmp_path / "r", a, [("3", 0.9)]),
                         Explanation(Path("y.png"), tmp_path / "r2", a, [("1", 0.9)])])
    cand = ExplainResult([Explanation(Path("x.png"), tmp_path / "c", b, [("3", 0.8)]),
                          Explanation(Path("y.png"), tmp_path / "c2", a, [("7", 0.6)])], model="m.onnx")
    r = compare_maps(ref, cand)
    assert r.images == 2 and r.top1_agreement == 0.5
    assert r.max_abs_diff == pytest.approx(0.25) and r.mean_abs_diff == pytest.approx(0.25 / 4 / 2)
    assert r.min_correlation == pytest.approx(np.corrcoef(a.ravel(), b.ravel())[0, 1]) and r.mean_correlation < 1
