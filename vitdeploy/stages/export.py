"""Checkpoint → ONNX with a dynamic batch, cleaned for TensorRT, then proven against PyTorch.

Exporter choice (measured on 2 CPU cores, vit-base at 224): torch's TorchScript
exporter (``dynamo=False``) takes ~13 s and writes opset 17 directly; the
dynamo exporter takes ~38 s and writes more Slice/Reshape nodes. The
TorchScript graph carries Constant/Identity/Shape chains, which onnxslim folds
and deduplicates. onnxslim re-runs shape inference on the whole model many
times (serializing every weight each time: ~40 s for vit-base), so it is given
a light copy in which every large initializer is a graph input of the same
shape, and its graph then replaces the model's around the weights, which never
move. Weights are never folded that way, which is right: the exporter already
folded them (transposed Linear weights), and anything a weight feeds depends on
the image. onnx.checker likewise sees the graph with stubs for the weights
(``check_graph``): the weights are never copied, which keeps vit-huge's 2.5 GB
export within a few GB of memory.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitdeploy.checks.parity import PARITY_BATCHES, ParityReport, validate_parity
from vitdeploy.core import fileio
from vitdeploy.core.artifact import BATCH_DIM, INPUT_NAME, OUTPUT_NAME, OnnxArtifact
from vitdeploy.core.errors import NonFiniteOutput, OpsetTooNew, ParityError, UsageError, VitdeployError
from vitdeploy.core.fileio import temp_dir_beside
from vitdeploy.core.loaded import SourceReads
from vitdeploy.core.manifest import Manifest, set_onnx_manifest, tool_versions
from vitdeploy.core.outputs import side_output_path
from vitdeploy.core.targets import TargetFacts, resolve_target
from vitdeploy.core.task import POOLS, task_from_model, task_of
from vitdeploy.graph.cleanup import (
    check_graph,
    fix_io,
    fold_constant_linears,
    initializer_bytes,
    merge_attention_scale,
    node_counts,
    slim,
)

if TYPE_CHECKING:
    import onnx
    import torch


DEFAULT_OPSET = 17
MIN_OPSET = 17
# Highest opset torch's TorchScript exporter writes; higher ones are reached with onnx's version converter.
TORCHSCRIPT_MAX_OPSET = 20
# Models whose weights exceed this go to external data (protobuf's hard limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000

Progress = Callable[[str, dict[str, Any]], None]


# --- export ---------------------------------------------------------------------------------


@dataclass
class ExportResult:
    path: Path
    manifest: Manifest
    parity: ParityReport | None  # iterates as the list of per-batch results
    node_counts: dict[str, int]
    opset: int
    seconds: float
    external_data: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "opset": self.opset,
            "external_data": str(self.external_data) if self.external_data else None,
            "node_counts": self.node_counts,
            "seconds": round(self.seconds, 2),
            "timings": {k: round(v, 2) for k, v in self.timings.items()},
            "parity": self.parity.to_dict() if self.parity is not None else None,
        }


def max_supported_opset() -> int:
    """The highest ai.onnx opset the installed onnx knows."""
    import onnx.defs

    return int(onnx.defs.onnx_opset_version())


def check_opset(opset: int) -> int:
    hi = max_supported_opset()
    if opset < MIN_OPSET:
        raise UsageError(
            f"--opset {opset} is below {MIN_OPSET}: 17 is the first opset with LayerNormalization "
            f"(which TensorRT keeps in FP32); choose {MIN_OPSET}..{hi}"
        )
    if opset > hi:
        raise UsageError(f"--opset {opset} is above {hi}, the highest the installed onnx supports; choose {MIN_OPSET}..{hi}")
    return opset


def check_target(target: str | None, opset: int) -> TargetFacts | None:
    """The target's facts; an unknown target (listing the valid ones) or an opset its parser cannot read is refused."""
    facts = resolve_target(target)  # a TensorRT line, ort, or a JetPack/module (core/devices.py)
    if facts is None:
        return None
    if facts.max_opset is not None and opset > facts.max_opset:
        raise OpsetTooNew(f"--opset {opset} is above {facts.max_opset}, the highest opset {facts.name}'s parser reads: "
                             f"choose --opset {MIN_OPSET}..{facts.max_opset}")
    if not facts.layernorm_op and opset > MIN_OPSET:
        raise VitdeployError(f"--target {facts.name} writes LayerNorm in primitive ops at opset {MIN_OPSET}: "
                             f"drop --opset {opset}")
    return facts


def _torch_export(model: torch.nn.Module, tmpdir: Path, h: int, w: int, opset: int,
                  outputs: tuple[str, ...] = (OUTPUT_NAME,)) -> onnx.ModelProto:
    """TorchScript export; in memory unless the weights need external data (over 2 GB). ``outputs``: the graph's
    output names (the task's: logits, or embedding [and patch_tokens])."""
    import io

    import onnx
    import torch

    x = torch.randn(2, 3, h, w)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    big = weight_bytes > EXTERNAL_DATA_THRESHOLD
    target: Any = tmpdir / "raw.onnx" if big else io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x,),
            str(target) if big else target,
            input_names=[INPUT_NAME],
            output_names=list(outputs),
            opset_version=min(opset, TORCHSCRIPT_MAX_OPSET),
            dynamic_axes={INPUT_NAME: {0: BATCH_DIM}, **{o: {0: BATCH_DIM} for o in outputs}},
            do_constant_folding=True,
            dynamo=False,
        )
    if not big:
        m = onnx.ModelProto()
        m.ParseFromString(target.getbuffer())  # no copy of the serialized bytes
        return m
    m = OnnxArtifact(target).load_weights()  # with the external data the exporter wrote beside it
    for f in tmpdir.iterdir():
        f.unlink()
    return m


def _load_model(checkpoint: str | Path, arch: str | None, labels: str | Path | None,
                as_embedding: EmbeddingOptions | None = None) -> tuple[Any, Manifest]:
    """The eval-mode model and its manifest (its task recorded: core/task.py); ``as_embedding`` makes an embedding
    model of it (export --embedding / --pool / --normalize / --tokens). A model whose input disagrees with its
    preprocessing is refused."""
    from vitdeploy.model.sources import check_source

    check_source(checkpoint, arch)  # a plain folder, a legacy torch.save file …: refused before torch is imported
    from vitdeploy.model.importers import load_any

    ck = load_any(checkpoint, arch=arch, labels=labels)
    manifest = ck.manifest
    task = task_of(manifest)
    if as_embedding is not None and as_embedding.requested:
        ck = as_embedding.apply(ck, str(checkpoint))
        manifest = ck.manifest
    elif task.is_embedding or "task" not in manifest.extra:
        manifest.extra["task"] = task.to_dict()
    model = ck.build()
    del ck  # the state dict is in the model now; vit-huge's 2.5 GB need not be held twice
    _check_norm_eps(model, checkpoint)
    h, w = manifest.input_size
    if tuple(model.cfg.image_size) != (h, w):
        raise VitdeployError(f"{checkpoint}: model input {model.cfg.image_size} differs from the preprocessing's {h}x{w}")
    return model, manifest


def _check_norm_eps(model: Any, checkpoint: str | Path) -> None:
    """Every norm's epsilon is a finite number >= 0, or one line naming it (issue 37, P11): a NaN or negative one
    (a foreign config's layer_norm_eps) traced into the graph, and ONNX Runtime refused the model at the parity check
    with its own log lines, which export misread as an opset its ONNX Runtime cannot load."""
    import math

    for name, m in model.named_modules():
        eps = getattr(m, "eps", None)
        if isinstance(eps, float) and not (math.isfinite(eps) and eps >= 0):
            field = "ln_eps" if hasattr(model, "cfg") and hasattr(model.cfg, "ln_eps") else "eps"
            raise VitdeployError(f"{checkpoint}: the epsilon of {type(m).__name__} {name or 'model'} is {eps} (the "
                                 f"manifest's model.{field}); it must be a finite number >= 0, e.g. 1e-6: fix the "
                                 "source config's layer_norm_eps and import it again")


@dataclass(frozen=True)
class EmbeddingOptions:
    """export --embedding / --pool / --normalize / --tokens: what the exported embedding model answers.

    ``embedding``: a classifier is exported as an embedding model (its pre-logits features; the head is dropped).
    ``pool``: cls | mean | cls+mean, where the model has the choice (a class token and a norm over every token).
    ``normalize``: the L2 normalisation in the graph. ``tokens``: a second output ``patch_tokens`` [batch, patches,
    width], the patch tokens after the final norm, without class or register tokens.
    """

    embedding: bool = False
    pool: str | None = None
    normalize: bool = False
    tokens: bool = False

    @property
    def requested(self) -> bool:
        return self.embedding or self.pool is not None or self.normalize or self.tokens

    def check(self) -> None:
        """Option values alone (exit 2 before anything is read)."""
        if self.pool is not None and self.pool not in POOLS:
            raise UsageError(f"--pool must be one of {', '.join(POOLS)}, not {self.pool!r}")

    def apply(self, ck: Any, where: str) -> Any:
        """The checkpoint as the embedding model these options ask for (the manifest's task and model updated, the
        classifier's head dropped); a combination the model cannot have is one line (exit 2)."""
        from vitdeploy.model.checkpoint import Checkpoint
        from vitdeploy.model.vit import ViTConfig

        self.check()
        m = ck.manifest
        cfg = ViTConfig.from_dict(m.model)
        task = task_of(m)
        if not task.is_embedding and not self.embedding:
            raise UsageError(f"{where} is a {task.describe()}: --pool, --normalize and --tokens shape an embedding "
                             "model; add --embedding to export its pre-logits features")
        changes: dict[str, Any] = {"num_classes": 0}
        if self.pool is not None:
            have = _pools_of(cfg)
            if self.pool not in have:
                own = ("its projection was trained on its own pooling" if cfg.proj_dim
                       else "it pools its own way only")
                raise UsageError(f"{where}: --pool {self.pool} is not a pooling this model has "
                                 f"({', '.join(have) or own})")
            changes["embed_pool"] = self.pool
        if self.normalize:
            changes["l2_norm"] = True
        if self.tokens and cfg.global_pool == "map" and not self.pool:
            raise UsageError(f"{where}: --tokens on a MAP-head model: its attention-pooling head reads every token, "
                             "so the patch tokens are not its features; export it without --tokens")
        if self.tokens and not cfg.final_norm:
            raise UsageError(f"{where}: --tokens needs a final norm over every token; this model has none")
        new = cfg.with_(**changes)
        state = {k: v for k, v in ck.state_dict.items() if not k.startswith(("head.", "head_dist."))}
        if cfg.use_fc_norm and changes.get("embed_pool"):  # never: _pools_of refuses; kept for a clear invariant
            raise UsageError(f"{where}: --pool on a model that norms after its pooling")
        manifest = m.derive(model=new.to_dict(), labels=[])
        manifest.extra["task"] = task_from_model(new.to_dict(), tokens=self.tokens).to_dict()
        return Checkpoint(manifest, state, None)


def _pools_of(cfg: Any) -> tuple[str, ...]:
    """The --pool values a model has (ViTConfig.embed_pools, the one rule, which train --probe shares)."""
    return tuple(cfg.embed_pools)


def _clean(m: onnx.ModelProto, manifest: Manifest, opset: int) -> onnx.ModelProto:
    """onnxslim, a Linear of a constant folded (the MAP head's query), one Mul per attention, the requested opset,
    fixed I/O shapes, and vitdeploy's producer fields."""
    from vitdeploy import __version__

    h, w = manifest.input_size
    slim(m)
    fold_constant_linears(m)
    merge_attention_scale(m)
    if opset > TORCHSCRIPT_MAX_OPSET:
        from onnx import version_converter

        m = version_converter.convert_version(m, opset)
    task = task_of(manifest)
    cfg = manifest.model
    patches = (h // int(cfg["patch_size"])) * (w // int(cfg["patch_size"]))
    dims: list[list[str | int]] = [[BATCH_DIM, task.dim]]
    if task.tokens:
        dims.append([BATCH_DIM, patches, int(cfg["embed_dim"])])
    fix_io(m, task.dim, h, w, outputs=dims)
    m.producer_name = "vitdeploy"
    m.producer_version = __version__
    what = " + ".join(f"{n} {d}" for n, d in zip(task.outputs, [str(d).replace("'", "") for d in dims], strict=True))
    m.doc_string = f"{manifest.name}: float32 pixel_values [batch, 3, {h}, {w}] → {what}"
    return m


def _derived_manifest(manifest: Manifest, checkpoint: str | Path, opset: int, target: str | None = None,
                      source_sha256: str | None = None) -> Manifest:
    """The ONNX model's manifest; ``source_sha256``: the SHA-256 of the checkpoint bytes converted (SourceReads),
    else the file's as it is now."""
    return manifest.derive(
        precision="fp32",
        target=target,
        source={
            "kind": "checkpoint",
            "path": Path(checkpoint).name,
            "sha256": source_sha256 or fileio.source_sha256(checkpoint),
            "dataset": manifest.source.get("dataset"),
            "parent": manifest.source,
        },
        versions=tool_versions("torch", "onnx", "onnxslim", "numpy"),
        export={"opset": opset, "input": INPUT_NAME, "output": task_of(manifest).output,
                **({"outputs": list(task_of(manifest).outputs)} if task_of(manifest).tokens else {}),
                "dynamic_axes": {"batch": 0}},
    )


def _validate(model: Any, tmp_model: Path, images: str | Path | None, opset: int, out: Path) -> ParityReport:
    """validate_parity on the written model, its failures said in the export's terms (nothing written)."""
    try:
        return validate_parity(model, tmp_model, images=images)
    except ParityError as e:
        raise ParityError(f"{e}; {out} not written (--no-check writes it anyway)") from None
    except NonFiniteOutput as e:  # the checkpoint answers NaN: no --no-check hint, nothing it writes would work
        raise NonFiniteOutput(f"{e}; {out} not written") from None
    except VitdeployError as e:
        if "ONNX Runtime cannot load" not in str(e):
            raise
        import onnxruntime

        why = str(e).split("ONNX Runtime cannot load it", 1)[-1].strip(" ()")
        lower = f"choose a lower --opset than {opset}, " if opset > MIN_OPSET else ""  # never below 17, LayerNorm's
        raise VitdeployError(
            f"ONNX Runtime {onnxruntime.__version__} cannot load the exported model for the parity check ({why}): "
            f"{lower}or --no-check to write it unchecked"
        ) from None


def _save_model(m: onnx.ModelProto, path: Path, data_name: str) -> bool:
    """Write the model; over EXTERNAL_DATA_THRESHOLD its weights go to ``data_name`` beside it. True when they did."""
    import onnx

    external = initializer_bytes(m) > EXTERNAL_DATA_THRESHOLD
    if external:
        onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
    else:
        onnx.save_model(m, str(path))
    return external


def _move_into_place(tmp_model: Path, out: Path, data_name: str, external: bool) -> None:
    """The data file first, so the .onnx never points at a missing file; a stale data file of the name goes."""
    old_data = out.with_name(data_name)
    if external:
        os.replace(tmp_model.with_name(data_name), old_data)
    os.replace(tmp_model, out)
    if not external and old_data.exists():
        old_data.unlink()  # a stale file from an earlier (external-data) export of this name


def export_onnx(
    checkpoint: str | Path = "ckpt.pth",
    out: str | Path = "model.onnx",
    opset: int = DEFAULT_OPSET,
    check: bool = True,
    images: str | Path | None = None,
    arch: str | None = None,
    labels: str | Path | None = None,
    progress: Progress | None = None,
    target: str | None = None,
    embedding: EmbeddingOptions | None = None,
) -> ExportResult:
    """Export a checkpoint to ONNX (dynamic batch, manifest inside) and, with ``check``, prove parity.

    The graph's output is the task's (core/task.py): ``logits`` [batch, classes] for a classifier, ``embedding``
    [batch, D] for an embedding model (a checkpoint without classes, or ``embedding`` options), plus ``patch_tokens``
    [batch, patches, width] with ``embedding.tokens``.

    ``target`` (core.targets.TARGETS) is what the graph is written for and goes into the manifest. None, the
    default, writes the opset-17 graph with one LayerNormalization op per norm, which TensorRT 8.6, 10, 11 and
    ONNX Runtime all read (and TensorRT keeps LayerNormalization in FP32); ``trt8.5`` spells LayerNorm out in
    primitive ops, because 8.5's parser has no LayerNormalization importer. An opset above the target's parser
    limit is refused.

    Everything is written into a temporary folder beside ``out`` and moved into place
    only after the checker and the parity check pass; a failure leaves an earlier
    ``out`` untouched. Node counts by op type are in the result.
    """

    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    check_opset(opset)
    if embedding is not None:
        embedding.check()
    facts = check_target(target, opset)
    target = facts.name if facts is not None else None  # the TensorRT line a device name resolved to
    out = Path(out)
    if out.suffix != ".onnx":
        raise VitdeployError(f"{out}: the output must end in .onnx")

    def step(name: str, **info: Any) -> None:
        if progress:
            progress(name, info)

    step("load", path=str(checkpoint))
    t = time.perf_counter()
    with SourceReads("export") as reads:  # the checkpoint's bytes are read once; lineage hashes those bytes
        model, manifest = _load_model(checkpoint, arch, labels, embedding)
    h, w = manifest.input_size
    timings["load"] = time.perf_counter() - t

    out.parent.mkdir(parents=True, exist_ok=True)
    tmpdir = temp_dir_beside(out)
    try:
        step("export", opset=opset)
        t = time.perf_counter()
        # LayerScale folded into the Linear before it (exact): no extra Mul per block in the graph TensorRT fuses;
        # the parity check below still compares with the unfolded model
        from vitdeploy.model.vit import WithPatchTokens, fold_layer_scale

        task = task_of(manifest)
        exported = fold_layer_scale(model)
        m = _torch_export(WithPatchTokens(exported) if task.tokens else exported, tmpdir, h, w, opset, task.outputs)
        timings["export"] = time.perf_counter() - t

        step("clean")
        t = time.perf_counter()
        m = _clean(m, manifest, opset)
        if facts is not None and not facts.layernorm_op:
            from vitdeploy.graph.target import decompose_layernorm

            decompose_layernorm(m)
        timings["clean"] = time.perf_counter() - t

        derived = _derived_manifest(manifest, checkpoint, opset, target, reads.sha256(checkpoint))
        set_onnx_manifest(m, derived)
        counts = node_counts(m)

        step("checker")
        t = time.perf_counter()
        check_graph(m, tmpdir)
        timings["checker"] = time.perf_counter() - t

        step("save")
        t = time.perf_counter()
        tmp_model = tmpdir / out.name
        data_name = side_output_path("external data", out).name
        external = _save_model(m, tmp_model, data_name)
        del m
        timings["save"] = time.perf_counter() - t

        parity: ParityReport | None = None
        if check:
            step("parity", batch_sizes=list(PARITY_BATCHES))
            t = time.perf_counter()
            parity = _validate(model, tmp_model, images, opset, out)
            timings["parity"] = time.perf_counter() - t

        reads.require_unchanged()  # a checkpoint replaced during the export: one line, nothing written
        _move_into_place(tmp_model, out, data_name, external)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return ExportResult(
        path=out,
        manifest=derived,
        parity=parity,
        node_counts=counts,
        opset=opset,
        seconds=time.perf_counter() - t0,
        external_data=out.with_name(data_name) if external else None,
        timings=timings,
    )
