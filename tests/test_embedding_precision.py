"""Precision where it breaks, for embedding models (issue 36, item 7): CLIP-, SigLIP- and DINOv2-style digits ViTs
exported as embedding models, rewritten into exactly equivalent copies that break FP16 and INT8 the way pretrained
CLIP, SigLIP and DINOv2 do, then made FP16 and INT8 by the product and judged on the TensorRT oracle against the FP32
model under ONNX Runtime, on the 360 digits val images.

The models (digits-sized: 32x32, patch 4, width 96, depth 4; trained on the digits through tests/artifact_cache.py):
* CLIP: the "clip" family (LayerNorm before the blocks, quick_gelu) with CLIP's visual projection (96 → 64), the
  projection and a new head fine-tuned from the clip family's checkpoint; the embedding is the projected class token;
* SigLIP: the "siglip" family (no class token, gelu_tanh, the MAP attention-pooling head), fine-tuned from the digits
  ViT's backbone (from scratch the MAP head reaches 16% val top-1 in the family cache's 4 epochs); the embedding is
  the MAP head's pooled output;
* DINOv2: the "registers" family (LayerScale, 4 register tokens); the embedding is the class token after the final
  norm (pooler_output).

The stress rewrites (tests/families.py, tests/helpers.py, as test_family_precision.py uses them): the residual stream
×c so it peaks at 1.2e5, past float16's 65504 (pretrained CLIP and DINOv2 streams reach |x| ≈ 1e3 and their squares
overflow), and a 50× spread of four LayerNorm output channels at every LayerNorm → GEMM (per-tensor INT8's enemy).

Figures held, per family and target: FP16 (convert-fp16, float32 islands where numerics measures float16 overflow)
on the trt10 and trt8.6 oracles: mean cosine ≥ 0.999, 1st percentile ≥ 0.995. INT8 by calibrate with the guard
(--eval the digits val, --min-cosine 0.99: the embedding budget of checks/judge.py) on the trt10 oracle (trt8.6 with
VITDEPLOY_SLOW=1): mean cosine ≥ 0.99, 1st percentile ≥ 0.97, nearest-neighbour agreement ≥ 97%; with every layer
quantized the stress misses that budget, so the guard has work to do. The same FP16 conversion without the measured
float32 islands falls far below the FP16 bar, so the stress is real and the tests can fail.

Nearest-neighbour agreement is the fragile figure: on these 360 images an image's nearest and second-nearest
neighbours differ in cosine by under 1.7e-4 for 5% of them (under 8e-6 for the SigLIP-style model, whose MAP vectors
lie closer together), so even FP16 (mean cosine 1.000000) moves 1-4 of them; the guard keeps layers in float until
it holds on the --eval images, and the test measures the file written on the same images (the figure is the eval
set's, as a user's `calibrate --eval val` then `verify -i val` sees it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import artifact_cache
import numpy as np
import onnx
import pytest
from families import export_in_memory, knobs, scaled_residual
from helpers import with_spread

# `make test` leaves these out (`make test-all` and CI run them): FP16/INT8 of the trained embedding families on the oracle (175 test-s of 3500 under load)
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CALIB = REPO / "calibration"
PEAK = 1.2e5  # the rewritten stream's peak |x|: past float16's 65504, so the residual Adds overflow
K = 50.0  # the LayerNorm channel spread
CHANNELS = [3, 17, 42, 77]
FP16 = {"min_cosine": 0.999, "min_cosine_p1": 0.995}  # the FP16 bar (TensorRT-Model-Connect's gates)
INT8 = {"min_cosine": 0.99, "min_cosine_p1": 0.97, "min_nn_agreement": 0.97}  # the INT8 bar
FAMILY_NAMES = ("clip", "siglip", "dinov2")
# INT8 for trt8.6 (float32 scales, float16 float parts around float32 quantized layers) passes too, at 2.2 CPU-min
# more for the three families (measured): run with VITDEPLOY_SLOW=1
SLOW = pytest.mark.skipif(not os.environ.get("VITDEPLOY_SLOW"),
                          reason="INT8 trt8.6 of the three embedding models (2.2 CPU-min): set VITDEPLOY_SLOW=1")


def _checkpoint(family: str) -> Path:
    """The family's trained digits checkpoint (cached across runs)."""
    if family == "clip":
        clip = artifact_cache.family_ckpt_entry("clip", knobs("clip")) / "ckpt.pth"
        return artifact_cache.warm_family_entry("clip_proj", {**knobs("clip"), "proj_dim": 64}, clip, epochs=2) / "ckpt.pth"
    if family == "siglip":
        digits = artifact_cache.ckpt_entry() / "ckpt.pth"
        return artifact_cache.warm_family_entry("siglip", knobs("siglip"), digits, epochs=3) / "ckpt.pth"
    return artifact_cache.family_ckpt_entry("registers", knobs("registers")) / "ckpt.pth"


@dataclass
class Stressed:
    name: str
    model: Path  # the FP32 embedding model as exported
    stress: Path  # its exactly equivalent stress rewrite
    x: np.ndarray  # the digits val images, preprocessed
    y: np.ndarray
    ref: np.ndarray  # the FP32 model's embeddings on them (ONNX Runtime)


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def stressed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, digits_folder: Path) -> Stressed:
    """The family's checkpoint exported as an embedding model (export --embedding's options on the model in memory),
    and the stress rewrite of it: ×c residual stream, then the channel spread on its graph."""
    from vitdeploy.checks.guard import load_eval_set, logits
    from vitdeploy.checks.numerics import numerics
    from vitdeploy.core.manifest import set_onnx_manifest
    from vitdeploy.model.checkpoint import load_checkpoint
    from vitdeploy.stages.export import EmbeddingOptions

    name = request.param
    d = tmp_path_factory.mktemp(f"emb-{name}")
    ck = EmbeddingOptions(embedding=True).apply(load_checkpoint(_checkpoint(name)), name)
    net = ck.build().eval()
    export_in_memory(net, ck.manifest, d / "model.onnx")
    peak = max(t.max_abs for t in numerics(d / "model.onnx", CALIB, num_images=32).tensors if t.role == "residual_add")
    export_in_memory(scaled_residual(net, PEAK / peak), ck.manifest, d / "big.onnx")
    spread = with_spread(onnx.load(str(d / "big.onnx")), K, CHANNELS)
    set_onnx_manifest(spread, ck.manifest.derive(precision="fp32"))
    onnx.save(spread, str(d / "stress.onnx"))
    ev = load_eval_set(digits_folder, ck.manifest)
    assert ev.y is not None
    return Stressed(name, d / "model.onnx", d / "stress.onnx", ev.x, ev.y, logits(onnx.load(str(d / "model.onnx")), ev.x))


def _on_oracle(s: Stressed, artifact: Path, target: str):  # -> EmbeddingComparison
    """The artifact's embeddings as TensorRT ``target`` computes them (the oracle) against FP32 (ONNX Runtime), with
    the val labels for the kNN top-1: checks/judge.py's comparison."""
    from vitdeploy.checks.judge import judge_for
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.runners.oracle.runner import runner_for_target

    judge = judge_for(read_onnx_manifest(artifact))
    assert judge is not None  # the manifest kept the task: an embedding model
    runner = runner_for_target(artifact, target)
    try:
        out = np.concatenate([runner(s.x[i:i + 120]) for i in range(0, len(s.x), 120)])
    finally:
        runner.close()
    return judge.compare(s.ref, out, s.y)


def _line(c) -> str:  # noqa: ANN001 (an EmbeddingComparison)
    return (f"mean {c.cosine_mean:.6f} p1 {c.cosine_p1:.6f} min {c.cosine_min:.5f} NN agreement {c.nn_agreement:.4f} "
            f"kNN top-1 {c.knn_top1:.4f} (FP32 {c.knn_top1_reference:.4f}) on {c.rows} images")


def test_the_stress_rewrite_is_exactly_equivalent_in_fp32_and_the_task_is_kept(stressed: Stressed) -> None:
    from helpers import ort_run

    from vitdeploy.checks.metrics import compare_embeddings
    from vitdeploy.core.artifact import read_onnx_manifest

    c = compare_embeddings(stressed.ref, ort_run(stressed.stress, stressed.x))
    assert c.cosine_min >= 0.99999 and c.rel_frobenius <= 1e-4, (stressed.name, c.cosine_min, c.rel_frobenius)
    task = read_onnx_manifest(stressed.stress).extra["task"]
    assert task["kind"] == "embedding"
    assert [o.name for o in onnx.load(str(stressed.stress)).graph.output] == ["embedding"]
    want = {"clip": {"projection": True, "dim": 64, "pool": "cls"}, "siglip": {"pool": "map", "dim": 96},
            "dinov2": {"pool": "cls", "register_tokens": 4, "dim": 96}}[stressed.name]
    assert {k: task.get(k) for k in want} == want, task


@pytest.mark.parametrize("target", ["trt10", "trt8.6"])
def test_fp16_with_float32_islands_keeps_the_embedding_on_the_oracle(stressed: Stressed, target: str,
                                                                     tmp_path: Path) -> None:
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.stages.precision import convert_fp16

    out = convert_fp16(stressed.stress, tmp_path / "stress.fp16.onnx", target=target, images=CALIB)
    m = read_onnx_manifest(out)
    assert m.precision == "fp16" and m.target == target and m.extra["task"]["kind"] == "embedding"
    assert m.extra["numerics"]["kept_fp32_nodes"]  # the overflowing stream was found and kept float32
    c = _on_oracle(stressed, out, target)
    print(f"\n{stressed.name} FP16 {target} oracle vs FP32: {_line(c)}; "
          f"{len(m.extra['numerics']['kept_fp32_nodes'])} nodes kept float32")
    assert c.cosine_mean >= FP16["min_cosine"] and c.cosine_p1 >= FP16["min_cosine_p1"], (stressed.name, target)


def test_fp16_without_the_measured_islands_breaks_on_the_stress(stressed: Stressed, tmp_path: Path) -> None:
    """The same conversion with LayerNorm, Softmax and the reductions in float32 but no islands where the stream
    overflows (what a converter that does not measure writes): far below the FP16 bar on the trt10 oracle."""
    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.graph.fp16 import to_fp16

    src = OnnxArtifact.open(stressed.stress)
    naive = tmp_path / "naive.fp16.onnx"
    OnnxArtifact.write(to_fp16(src.load_weights()), src.manifest.derive(precision="fp16", target="trt10"), naive)
    c = _on_oracle(stressed, naive, "trt10")
    print(f"\n{stressed.name} naive FP16 (no float32 islands) trt10 oracle vs FP32: mean {c.cosine_mean:.4f} "
          f"p1 {c.cosine_p1:.4f}, {c.nonfinite} of {c.rows} embeddings NaN/Inf")
    assert c.cosine_mean < FP16["min_cosine"] and c.cosine_p1 < FP16["min_cosine_p1"], stressed.name


@pytest.mark.parametrize("target", ["trt10", pytest.param("trt8.6", marks=SLOW)])
def test_int8_with_the_guard_meets_the_embedding_budget_on_the_oracle(stressed: Stressed, target: str,
                                                                      digits_folder: Path, tmp_path: Path) -> None:
    from vitdeploy.stages.precision import calibrate

    res = calibrate(stressed.stress, CALIB, tmp_path / "stress.int8.onnx", num_images=256, target=target,
                    eval_dir=digits_folder, min_cosine=INT8["min_cosine"])
    g = res.manifest.extra["guard"]
    assert res.manifest.extra["task"]["kind"] == "embedding" and res.manifest.target == target
    assert g["judged_as"] == "embedding" and g["met"] and g["backend"] == "oracle"
    assert {k: g[k] for k in INT8} == INT8
    from vitdeploy.checks.judge import EmbeddingBudget

    b = g["before"]  # every layer quantized: the stress breaks the budget, and the guard earns its keep
    missed = [k for k, v in (("cosine_mean", b["cosine_mean"] < INT8["min_cosine"]),
                             ("cosine_p1", b["cosine_p1"] < INT8["min_cosine_p1"]),
                             ("nn_agreement", b["nn_agreement"] < INT8["min_nn_agreement"])) if v]
    assert missed and res.excluded, (stressed.name, b)
    assert EmbeddingBudget(**INT8) == EmbeddingBudget(g["min_cosine"], g["min_cosine_p1"], g["min_nn_agreement"])
    c = _on_oracle(stressed, res.path, target)  # the file written, read back and run again
    total = len(res.quantized) + len(res.excluded)
    print(f"\n{stressed.name} INT8 {target} (guarded, --min-cosine {INT8['min_cosine']}) oracle vs FP32: {_line(c)}; "
          f"{len(res.excluded)} of {total} layers kept in float {res.excluded}; with every layer quantized: mean "
          f"{b['cosine_mean']:.6f} p1 {b['cosine_p1']:.6f} NN agreement {b['nn_agreement']:.4f}")
    assert c.rows == 360
    assert c.cosine_mean >= INT8["min_cosine"] and c.cosine_p1 >= INT8["min_cosine_p1"], stressed.name
    assert c.nn_agreement >= INT8["min_nn_agreement"], stressed.name
    # the guard's record is the file's figure (it judged the float16 graph written, not its float32 form)
    assert g["after"]["nn_agreement"] == pytest.approx(c.nn_agreement, abs=1e-6)
    assert g["after"]["cosine_mean"] == pytest.approx(c.cosine_mean, abs=1e-6)
    assert len(res.quantized) >= total // 2  # still an INT8 model: most layers quantized


# --- the guard's budget options on an embedding model: the CLI, and the refusals -----------------------------------


@pytest.fixture(scope="module")
def digits_embedding(tmp_path_factory: pytest.TempPathFactory, digits_ckpt: Path) -> Path:
    """The suite's digits ViT as `vitdeploy export --embedding` writes it (its pre-logits features)."""
    from typer.testing import CliRunner

    from vitdeploy.cli import app

    d = tmp_path_factory.mktemp("emb-cli")
    res = CliRunner().invoke(app, ["export", str(digits_ckpt), "-o", str(d / "model.onnx"), "--embedding", "--no-check"])
    assert res.exit_code == 0, res.output
    return d / "model.onnx"


def _refused(args: list[str], *words: str) -> None:
    from typer.testing import CliRunner

    from vitdeploy.cli import app

    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in res.output, res.output
    for w in words:
        assert w in err[0], err[0]


def test_a_top1_budget_on_an_embedding_model_names_min_cosine_and_writes_nothing(
        digits_embedding: Path, digits_onnx: Path, digits_folder: Path, tmp_path: Path) -> None:
    loose = tmp_path / "loose"  # images without class folders: no labels, so no kNN top-1 to hold a drop to
    loose.mkdir()
    for f in sorted(CALIB.glob("digit3_*.png"))[:8]:
        (loose / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "x.int8.onnx"
    _refused(["calibrate", str(digits_embedding), "-i", str(CALIB), "-o", str(out), "--eval", str(loose),
              "--max-drop", "1"], "--max-drop", "--min-cosine", "embedding")
    # a classifier has no cosine budget; a budget needs --eval
    _refused(["calibrate", str(digits_onnx), "-i", str(CALIB), "-o", str(out), "--eval", str(digits_folder),
              "--min-cosine", "0.99"], "--min-cosine", "classifier", "--max-drop")
    _refused(["calibrate", str(digits_embedding), "-i", str(CALIB), "-o", str(out), "--min-cosine", "0.99"], "--eval")
    assert not out.exists() and not list(tmp_path.glob("x.int8*"))


def test_the_guards_criterion_is_the_tasks(digits_embedding: Path, digits_onnx: Path, digits_folder: Path,
                                           tmp_path: Path) -> None:
    """criterion_for: a classifier keeps its top-1 budget; an embedding model gets the INT8 EmbeddingBudget with
    --min-cosine as its mean gate, --min-agreement as its nearest-neighbour gate, and --max-drop as a kNN top-1 drop
    where --eval is labeled."""
    from vitdeploy.checks.guard import ClassifierCriterion, EmbeddingCriterion, criterion_for
    from vitdeploy.core.artifact import read_onnx_manifest

    emb, cls = read_onnx_manifest(digits_embedding), read_onnx_manifest(digits_onnx)
    assert criterion_for(cls, 0.5, 0.99) == ClassifierCriterion(0.5, 0.99)
    c = criterion_for(emb, None, None, 0.995, digits_folder)
    assert isinstance(c, EmbeddingCriterion) and c.active and c.max_knn_drop is None
    assert c.budget() == {"judged_as": "embedding", "min_cosine": 0.995, "min_cosine_p1": 0.97, "min_nn_agreement": 0.97}
    c = criterion_for(emb, 1.0, 0.99, None, digits_folder)  # labeled: --max-drop is the kNN top-1 drop
    assert isinstance(c, EmbeddingCriterion)
    assert c.budget() == {"judged_as": "embedding", "min_cosine": 0.99, "min_cosine_p1": 0.97, "min_nn_agreement": 0.99,
                          "max_knn_drop_points": 1.0}
    plain = criterion_for(emb, None, None, None, digits_folder)  # --eval alone: measured, nothing excluded
    assert isinstance(plain, EmbeddingCriterion) and not plain.active


def test_cli_calibrate_and_convert_fp16_on_an_embedding_model(digits_embedding: Path, digits_folder: Path,
                                                               tmp_path: Path) -> None:
    """`calibrate --eval DIR --min-cosine` on an embedding model (a CPU target: judged on ONNX Runtime) prints the
    cosine figures, not top-1, and the manifest's guard entry records them with the budget (--min-agreement its
    nearest-neighbour gate, loose here so no layer need go back to float: the guard's loop is the INT8 tests' above);
    `convert-fp16` keeps the task and the output."""
    from typer.testing import CliRunner

    from vitdeploy.cli import app
    from vitdeploy.core.artifact import read_onnx_manifest

    out = tmp_path / "model.int8.onnx"
    res = CliRunner().invoke(app, ["calibrate", str(digits_embedding), "-i", str(CALIB), "--num-images", "128",
                                   "-o", str(out), "--eval", str(digits_folder), "--min-cosine", "0.99", "--min-agreement", "0.9",
                                   "-t", "cpu"])
    assert res.exit_code == 0, res.output
    assert "on 360 images, INT8 against FP32: mean cosine" in res.stdout and "top-1 " in res.stdout  # kNN top-1
    g = read_onnx_manifest(out).extra["guard"]
    print(f"\ndigits ViT --embedding, INT8 -t cpu on ONNX Runtime: {g['after']}, kept in float: {g['excluded']}")
    assert g["judged_as"] == "embedding" and g["met"] and g["backend"] == "onnxruntime"
    assert (g["min_cosine"], g["min_cosine_p1"], g["min_nn_agreement"]) == (0.99, 0.97, 0.9)
    assert g["after"]["images"] == 360 and g["after"]["cosine_mean"] >= 0.99 and g["after"]["knn_top1"] is not None
    fp16 = tmp_path / "model.fp16.onnx"
    res = CliRunner().invoke(app, ["convert-fp16", str(digits_embedding), "-o", str(fp16), "-t", "trt10"])
    assert res.exit_code == 0, res.output
    assert read_onnx_manifest(fp16).extra["task"] == read_onnx_manifest(digits_embedding).extra["task"]
    assert [o.name for o in onnx.load(str(fp16)).graph.output] == ["embedding"]
