"""`train DATA --init BACKBONE --probe linear|knn`: a head on a frozen backbone's cached features (model/probe.py).

Two backbones. The session's digits ViT, a trained classifier whose pre-logits features are read: its features are
well conditioned, so scikit-learn's exact solver (newton-cholesky) reaches the optimum on them and the probe is held
to it, C by C. And a depth-2 DINOv2-style timm model (random weights, LayerScale raised so its blocks count) saved as
timm's ``save_for_hf`` folder, an embedding model as users hold one: the cache, its lineage, the CLI's lines and the
refusals run on it, over 100 digit scans so each feature pass is short.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_cases import run_cli_cases
from helpers import ort_run

# `make test` leaves these out (`make test-all` and CI run them): linear and kNN probes trained on frozen features, against scikit-learn (45 test-s of 920)
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

DIM = 96  # the DINOv2-style backbone's width: cls+mean features are 2 * DIM wide
POINT = 0.01  # one point of top-1: the margin to scikit-learn (1 of 360 digits val images is 0.28 points)


def save_dinov2(folder: Path, seed: int) -> Path:
    """A depth-2 vit_small_patch14_dinov2 (96 wide, 32x32 at patch 4, no head) with seeded weights, saved as timm's
    ``save_for_hf`` writes it (config.json + model.safetensors); LayerScale drawn around 0.5, not timm's 1e-5, so
    the blocks change the features and a new seed changes them."""
    from timm.models import save_for_hf

    torch.manual_seed(seed)
    m = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0, depth=2, img_size=32,
                          patch_size=4, embed_dim=DIM, num_heads=3)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("gamma"):
                p.copy_(0.5 + 0.3 * torch.randn(p.shape))
    save_for_hf(m.eval(), folder)
    return folder


@pytest.fixture(scope="module")
def digits_small(digits_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits folder with 30 train images a class (300) and its whole val/ (360: one image is 0.28 points):
    scikit-learn's exact solver builds its Hessian over every train image at every step."""
    import shutil

    root = tmp_path_factory.mktemp("digits_small")
    shutil.copytree(digits_folder / "val", root / "val")
    for d in sorted((digits_folder / "train").iterdir()):
        (root / "train" / d.name).mkdir(parents=True)
        for f in sorted(d.iterdir())[:30]:
            shutil.copy(f, root / "train" / d.name / f.name)
    return root


@pytest.fixture(scope="module")
def digits_probe(digits_ckpt: Path, digits_small: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The digits ViT as a frozen backbone, a linear probe on its cls+mean features over the digits images."""
    from vitdeploy.model.probe import train_probe
    from vitdeploy.model.train_options import TrainOptions

    out = tmp_path_factory.mktemp("probe") / "probe.pth"
    return train_probe(digits_small, TrainOptions(init=digits_ckpt, probe="linear", pool="cls+mean", out=out))


def sklearn_objective(model: Any, x: np.ndarray, y: np.ndarray, c: float) -> float:
    """What LogisticRegression(C) minimises, from scikit-learn's own probabilities: log_loss + ||W||² / (2·C·N)."""
    from sklearn.metrics import log_loss

    return float(log_loss(y, model.predict_proba(x), labels=model.classes_) + 0.5 / (c * len(y)) * (model.coef_**2).sum())


# Cs where scikit-learn's exact solver is checked beside the chosen one: newton-cholesky builds the 1,930-parameter
# Hessian at every step (seconds a fit on 2 cores; more at the large C the probe chooses), so two of the 45
SKLEARN_CS = (1e-3, 1.0)
# The probe stops at a preconditioned gradient of 1e-5 (model/probe.py GRAD_TOL): at the largest Cs, where the digits
# features are nearly separable, measured 0.3% above the exact optimum's objective; 1% is the margin.
OBJECTIVE_MARGIN = 0.01


def test_linear_probe_is_sklearns_logistic_regression(digits_probe: Any) -> None:
    """On the same cached features, scikit-learn's LogisticRegression (its exact newton-cholesky solver) gives, at the
    probe's Cs, the probe's val top-1 within a point; at the C the probe chose, the same objective (within the
    probe's stopping margin) and the same top-1; and the probe's choice is within a point of scikit-learn's best."""
    from sklearn.linear_model import LogisticRegression

    f, fit = digits_probe.features, digits_probe.fit
    tr, va = f.split(0.1, 0)
    x, y = f.x.astype(np.float64), f.labels
    ours = dict(fit.sweep)
    sk_accs = {}
    for c in (*SKLEARN_CS, fit.C):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a scikit-learn fit that did not converge is no reference
            sk = LogisticRegression(C=c, solver="newton-cholesky", tol=1e-8, max_iter=200).fit(x[tr], y[tr])
        sk_accs[c] = float(sk.score(x[va], y[va]))
        assert c in ours and abs(ours[c] - sk_accs[c]) <= POINT, (c, ours.get(c), sk_accs[c])
    assert fit.val_accuracy >= max(sk_accs.values()) - POINT, (fit.val_accuracy, sk_accs)
    # at the chosen C (sk is that fit): the same optimum, its head a LogisticRegression's coef_ / intercept_
    logits = fit.logits(x[tr])
    p = np.exp(logits - logits.max(1, keepdims=True))
    ours_obj = float(-np.log((p / p.sum(1, keepdims=True))[np.arange(len(tr)), y[tr]]).mean()
                     + 0.5 / (fit.C * len(tr)) * (fit.weight**2).sum())
    sk_obj = sklearn_objective(sk, x[tr], y[tr], fit.C)
    print(f"probe val top-1 {fit.val_accuracy:.2%} at C={fit.C:.3g} (scikit-learn {sk_accs[fit.C]:.2%}); objective "
          f"{ours_obj:.6f} vs scikit-learn's {sk_obj:.6f}; per C {[(c, ours[c], sk_accs[c]) for c in SKLEARN_CS]}")
    assert ours_obj <= sk_obj * (1 + OBJECTIVE_MARGIN), (ours_obj, sk_obj)
    assert (sk.predict(x[va]) == fit.logits(x[va]).argmax(1)).mean() >= 1 - POINT


def test_folded_classifier_onnx_is_the_head_on_the_features(digits_probe: Any, digits_ckpt: Path, tmp_path: Path) -> None:
    """`vitdeploy export` of the folded checkpoint answers the probe's head applied to the features, on ONNX Runtime:
    within 1e-5 (of the largest |logit|) of the head on the backbone's own ONNX features (`export --embedding --pool
    cls+mean`, the same graph less the head: what the fold is), and within 1e-4 with the same top-1 against the head
    on the cached torch features (float32 torch and ONNX Runtime differ in the last bits, which the head scales)."""
    from vitdeploy.core.preprocess import preprocess_file
    from vitdeploy.model.checkpoint import load_checkpoint
    from vitdeploy.stages.export import EmbeddingOptions, export_onnx

    ck = load_checkpoint(digits_probe.checkpoint)
    folded = export_onnx(digits_probe.checkpoint, tmp_path / "probe.onnx", check=False).path
    backbone = export_onnx(digits_ckpt, tmp_path / "features.onnx", check=False,
                           embedding=EmbeddingOptions(embedding=True, pool="cls+mean")).path
    f, fit = digits_probe.features, digits_probe.fit
    _, va = f.split(0.1, 0)
    x = np.stack([preprocess_file(f.paths[i], ck.manifest.pp()) for i in va])
    got = ort_run(folded, x).astype(np.float64)
    on_onnx, on_cache = fit.logits(ort_run(backbone, x)), fit.logits(f.x[va])
    scale = max(1.0, float(np.abs(on_cache).max()))
    d_onnx, d_cache = float(np.abs(got - on_onnx).max()), float(np.abs(got - on_cache).max())
    print(f"folded ONNX vs head(ONNX features): max |Δlogit| {d_onnx:.2e}; vs head(cached torch features) "
          f"{d_cache:.2e}; largest |logit| {scale:.3g}")
    assert d_onnx <= 1e-5 * scale, (d_onnx, scale)
    assert d_cache <= 1e-4 * scale, (d_cache, scale)
    assert (got.argmax(1) == on_cache.argmax(1)).all()


def test_folded_checkpoint_is_the_backbone_with_the_probe_as_its_head(digits_probe: Any, digits_ckpt: Path) -> None:
    """The manifest says what it is (a classifier of the folder's classes; task.probe: linear, its features, the
    backbone's SHA-256); the backbone's weights are unchanged; only the head is new."""
    from vitdeploy.core.fileio import source_sha256
    from vitdeploy.core.task import task_of
    from vitdeploy.model.checkpoint import load_checkpoint

    ck, bb = load_checkpoint(digits_probe.checkpoint), load_checkpoint(digits_ckpt)
    task = task_of(ck.manifest)
    assert task.kind == "classifier" and task.dim == 10 and ck.manifest.labels == [str(i) for i in range(10)]
    assert task.probe is not None and task.probe["kind"] == "linear" and task.probe["features"] == "cls+mean"
    assert task.probe["backbone_sha256"] == source_sha256(digits_ckpt)
    assert ck.manifest.model["embed_pool"] == "cls+mean" and ck.manifest.model["num_classes"] == 10
    assert "probe on frozen cls+mean features" in task.describe()
    for k, v in bb.state_dict.items():
        if not k.startswith("head."):
            assert torch.equal(ck.state_dict[k], v), k
    assert ck.state_dict["head.weight"].shape == (10, 2 * 96)
    np.testing.assert_allclose(ck.state_dict["head.weight"].numpy(), digits_probe.fit.weight, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def dinov2_cli(digits_val10: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """In one vitdeploy process (tests/cli_cases.py), in a scratch folder: the refusals, then a linear probe on the
    DINOv2-style folder over 100 digit scans, the same again, and a kNN probe."""
    work = tmp_path_factory.mktemp("dinov2cli")
    backbone = save_dinov2(work / "dinov2", seed=0)
    loose = work / "loose"
    loose.mkdir()
    for f in sorted(digits_val10.rglob("*.png"))[:6]:
        (loose / f.name).write_bytes(f.read_bytes())
    one = work / "one" / "cat"
    one.mkdir(parents=True)
    for f in sorted(digits_val10.rglob("*.png"))[:4]:
        (one / f.name).write_bytes(f.read_bytes())
    data, bb = str(digits_val10), str(backbone)
    refusals = {
        "no classes": ["train", str(loose), "--init", bb, "--probe", "linear"],
        "one class": ["train", str(work / "one"), "--init", bb, "--probe", "linear"],
        "no backbone": ["train", data, "--probe", "linear"],
        "fine-tuning options": ["train", data, "--init", bb, "--probe", "linear", "--epochs", "5", "--lr", "0.01"],
        "unknown probe": ["train", data, "--init", bb, "--probe", "svm"],
        "resume": ["train", data, "--init", bb, "--probe", "linear", "--resume", bb],
        "pool": ["train", data, "--init", bb, "--probe", "linear", "--pool", "avg"],
        "precision": ["train", data, "--init", bb, "--probe", "knn", "--precision", "fp32"],
    }
    runs = {"linear": ["train", data, "--init", bb, "--probe", "linear", "-o", "p.pth"],
            "again": ["train", data, "--init", bb, "--probe", "linear", "-o", "p.pth"],
            "knn": ["train", data, "--init", bb, "--probe", "knn", "-o", "p.pth"]}
    cases = run_cli_cases([*refusals.values(), *runs.values()], cwd=work)
    return {"work": work, **dict(zip([*refusals, *runs], cases, strict=True))}


@pytest.mark.parametrize("case", ["no classes", "one class", "no backbone", "fine-tuning options", "unknown probe",
                                  "resume", "pool", "precision"])
def test_probe_bad_input_is_one_line_and_writes_nothing(dinov2_cli: dict[str, Any], case: str) -> None:
    c = dinov2_cli[case]
    assert c.code == 2, (c.argv, c.code, c.stderr)
    assert len(c.lines()) == 1 and c.lines()[0].startswith("error: ") and "Traceback" not in c.stderr, c.stderr
    assert c.changed == [], c.changed
    said = {"no classes": "class sub-folders", "one class": "only one class", "no backbone": "--init",
            "fine-tuning options": "--epochs, --lr", "unknown probe": "linear, knn", "resume": "--resume",
            "pool": "cls, mean, cls+mean", "precision": "--precision"}[case]
    assert said in c.stderr, c.stderr


def test_probe_refusals_come_before_torch(dinov2_cli: dict[str, Any]) -> None:
    """Every refusal above (options, a folder without classes) is made before torch is imported: the process that ran
    them all, in order, had not imported it by the last one (usage errors are light, tests/test_usage_errors_are_light)."""
    assert dinov2_cli["precision"].loaded("torch", "vitdeploy.model.vit") == []


def test_features_are_cached_and_reused(dinov2_cli: dict[str, Any]) -> None:
    """The first run computes the features and keeps them beside the checkpoint; the second reads them (nothing
    computed, only the checkpoint rewritten); --probe knn reads them too and writes no checkpoint."""
    first, again, knn = dinov2_cli["linear"], dinov2_cli["again"], dinov2_cli["knn"]
    assert first.code == 0, first.stderr
    assert "features of 100 images computed" in first.stdout and "→ p.pth.features.npz" in first.stdout, first.stdout
    assert sorted(first.changed) == ["p.pth", "p.pth.features.npz"], first.changed
    assert "linear probe on cls features" in first.stdout and "linear probe on cls+mean features" in first.stdout
    assert "next: vitdeploy export p.pth" in first.stdout
    assert again.code == 0, again.stderr
    assert "read from p.pth.features.npz" in again.stdout and "computed" not in again.stdout.replace("nothing computed", "")
    assert again.changed == ["p.pth"], again.changed
    assert knn.code == 0, knn.stderr
    assert "read from p.pth.features.npz" in knn.stdout and knn.changed == [], (knn.stdout, knn.changed)
    assert "kNN val top-1" in knn.stdout and "k=20, T=0.07" in knn.stdout and "no checkpoint written" in knn.stdout


def test_stale_cache_is_recomputed_when_the_backbone_changes(dinov2_cli: dict[str, Any], digits_val10: Path) -> None:
    """The same folder re-saved with other weights: the cache's key names the old backbone, so the features are
    computed again, said in one note, and kept under the new bytes' SHA-256; the next read computes nothing."""
    from vitdeploy.core.fileio import source_sha256
    from vitdeploy.model.probe import cache_path, probe_features
    from vitdeploy.model.train_options import TrainOptions

    work = dinov2_cli["work"]
    out = work / "stale.pth"
    (work / "p.pth.features.npz").replace(cache_path(out))  # the cache of the CLI runs, made from seed 0
    backbone = save_dinov2(work / "dinov2", seed=1)
    opts = TrainOptions(init=backbone, probe="linear", out=out)
    events: list[tuple[str, dict[str, Any]]] = []
    feats, _, _ = probe_features(digits_val10, opts, lambda kind, d: events.append((kind, d)))
    notes = [d["text"] for kind, d in events if kind == "note"]
    assert len(notes) == 1 and "is stale (made from another backbone" in notes[0], notes
    assert feats.computed and any(kind == "features" for kind, _ in events)
    with np.load(cache_path(out)) as z:
        assert json.loads(str(z["key"]))["backbone_sha256"] == source_sha256(backbone)
        assert np.array_equal(z["features"], feats.x)
    events.clear()
    again, _, _ = probe_features(digits_val10, opts, lambda kind, d: events.append((kind, d)))
    assert not again.computed and events == [] and np.array_equal(again.x, feats.x)
    assert not out.exists()  # features only: no checkpoint


def test_library_train_refuses_a_probe_and_points_to_train_probe(tmp_path: Path) -> None:
    from vitdeploy.core.errors import UsageError
    from vitdeploy.model.train import TrainOptions, train

    with pytest.raises(UsageError, match="train_probe"):
        train(None, TrainOptions(init=tmp_path / "x.pth", probe="linear", out=tmp_path / "o.pth"))


def save_small(path: Path, **knobs: Any) -> Path:
    """A 1-block vit-digits-sized backbone with ``knobs`` (random weights), as a vitdeploy checkpoint."""
    from vitdeploy.core.manifest import Manifest
    from vitdeploy.model.checkpoint import save_checkpoint
    from vitdeploy.model.presets import get_preset
    from vitdeploy.model.vit import VisionTransformer

    preset = get_preset("vit-digits")
    torch.manual_seed(0)
    model = VisionTransformer(preset.config.with_(depth=1, num_classes=0, **knobs))
    save_checkpoint(path, model, Manifest(model=model.cfg.to_dict(), labels=[], preprocess=dict(preset.preprocess)))
    return path


@pytest.mark.parametrize("knobs", [{"distilled": True}, {"proj_dim": 16, "l2_norm": True}],
                         ids=["distilled", "clip-like projection"])
def test_backbones_that_pool_their_own_way_fold_their_own_features(knobs: dict[str, Any], digits_val10: Path,
                                                                  tmp_path: Path) -> None:
    """A distilled backbone (its vector the mean of the class and distillation tokens) and a CLIP-like one (projected,
    L2-normalised) offer no other pooling: the probe reads their own vector, --pool is refused naming that, and the
    fold puts the head where their own classifier goes (both of a distilled model's heads, so their mean is the
    probe). train_probe checks the folded model's logits against the probe's on val images before writing."""
    from vitdeploy.core.errors import UsageError
    from vitdeploy.model.checkpoint import load_checkpoint
    from vitdeploy.model.probe import train_probe
    from vitdeploy.model.train_options import TrainOptions

    backbone = save_small(tmp_path / "backbone.pth", **knobs)
    with pytest.raises(UsageError, match="pools by .* itself and --pool takes no other pooling"):
        train_probe(digits_val10, TrainOptions(init=backbone, probe="linear", pool="cls+mean", out=tmp_path / "p.pth"))
    assert not (tmp_path / "p.pth").exists() and not (tmp_path / "p.pth.features.npz").exists()
    r = train_probe(digits_val10, TrainOptions(init=backbone, probe="linear", out=tmp_path / "p.pth"))
    assert list(r.fits) == [r.pool] == (["distilled"] if "distilled" in knobs else ["cls"])
    ck = load_checkpoint(r.checkpoint)
    assert ck.manifest.model["num_classes"] == 10 and "embed_pool" not in ck.manifest.model
    assert r.fit.weight.shape == (10, 16 if "proj_dim" in knobs else 96)
    if "distilled" in knobs:
        assert torch.equal(ck.state_dict["head.weight"], ck.state_dict["head_dist.weight"])
    assert r.folded_max_abs_diff <= 1e-4
