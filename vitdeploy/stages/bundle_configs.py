"""The bundle's configuration files: Triton's config.pbtxt, DeepStream's nvinfer config, the C++ example's header,
labels files, and the templates in bundle_files/ filled in."""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.task import TOKENS_OUTPUT, task_of
from vitdeploy.core.text import label_problem

TEMPLATES = Path(__file__).with_name("bundle_files")
DS_NETWORK_MODE = {"fp32": 0, "int8": 1, "fp16": 2}
DS_SCALING_FILTER = {"nearest": 0, "bilinear": 1, "bicubic": 2}
ONNX_TO_TRITON = {1: "TYPE_FP32", 10: "TYPE_FP16", 2: "TYPE_UINT8", 3: "TYPE_INT8", 7: "TYPE_INT64", 6: "TYPE_INT32"}


def _desc(v: Any) -> dict[str, Any]:
    dims = [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in v.type.tensor_type.shape.dim]
    return {"name": v.name, "elem_type": v.type.tensor_type.elem_type, "dims": dims}


def _onnx_ios(model: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The input and every output of an onnx.ModelProto (or of the ONNX file at a path, read through its
    OnnxArtifact): an embedding model exported with --tokens has two (embedding, patch_tokens)."""
    g = (OnnxArtifact.open(model).model if isinstance(model, (str, Path)) else model).graph
    inits = {i.name for i in g.initializer}
    (inp,) = [i for i in g.input if i.name not in inits]
    return _desc(inp), [_desc(o) for o in g.output]


def _onnx_io(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Input and first output (logits or embedding) of an onnx.ModelProto or ONNX file."""
    inp, outs = _onnx_ios(model)
    return inp, outs[0]


# --- which models, and are they current? -------------------------------------------------------------------


def triton_name(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")
    return s or "vit"


def labels_file(labels: Sequence[str]) -> str:
    """labels.txt: one label per line. A label holding a line break or a control character is refused, named with
    it escaped: read by '\\n' it would be one label, by str.splitlines() several, and on a terminal an escape."""
    for i, lab in enumerate(labels):
        bad = label_problem(lab)
        if bad:
            shown = lab.encode("unicode_escape").decode("ascii")
            raise VitdeployError(f"label {i} '{shown}' {bad}; labels.txt holds one plain label per line: rename "
                                 "that class in the model's labels and make the bundle again")
    return "".join(f"{lab}\n" for lab in labels)


def triton_config(name: str, onnx_model: Any, max_batch: int, opt_batch: int, platform: str = "onnxruntime_onnx",
                  labels: bool = True) -> str:
    """config.pbtxt in Triton's text format (``onnx_model``: a ModelProto or a path): shapes without the batch dim.

    A classifier's output carries ``label_filename`` (Triton's classification extension answers labels); an
    embedding model's outputs (``labels`` False) are plain tensors, each declared with its dims: ``embedding`` [D],
    and ``patch_tokens`` [P, width] where the model has them."""
    inp, outs = _onnx_ios(onnx_model)
    layout = "FORMAT_NHWC" if inp["dims"][-1] == 3 else "FORMAT_NCHW"

    def dims(d: list[Any]) -> str:
        return ", ".join(str(v) for v in d[1:])

    preferred = sorted({b for b in (opt_batch, max_batch) if 1 <= b <= max_batch})
    blocks = []
    for i, out in enumerate(outs if not labels else outs[:1]):
        blocks.append(
            "  {\n"
            f'    name: "{out["name"]}"\n    data_type: {ONNX_TO_TRITON[out["elem_type"]]}\n'
            f"    dims: [ {dims(out['dims'])} ]\n"
            + ('    label_filename: "labels.txt"\n' if labels and i == 0 else "")
            + "  }"
        )
    return (
        f'name: "{name}"\n'
        f'platform: "{platform}"\n'
        f"max_batch_size: {max_batch}\n"
        "input [\n  {\n"
        f'    name: "{inp["name"]}"\n    data_type: {ONNX_TO_TRITON[inp["elem_type"]]}\n'
        f"    format: {layout}\n    dims: [ {dims(inp['dims'])} ]\n"
        "  }\n]\n"
        "output [\n" + ",\n".join(blocks) + "\n]\n"
        "dynamic_batching {\n"
        f"  preferred_batch_size: [ {', '.join(map(str, preferred))} ]\n"
        "  max_queue_delay_microseconds: 500\n"
        "}\n"
    )


# DeepStream's Gst-nvinfer keys for a model whose output nvinfer does not parse ("Gst-nvinfer File Configuration
# Specifications" in the DeepStream developer guide, DS_plugin_gst-nvinfer): network-type "Type of network: 0 Detector,
# 1 Classifier, 2 Segmentation, 3 Instance Segmentation, 100 Other"; output-tensor-meta "Gst-nvinfer attaches raw
# tensor output as Gst Buffer metadata" (NvDsInferTensorMeta, NVDSINFER_TENSOR_OUTPUT_META, in the frame's or object's
# user meta list); output-blob-names "array of output layer names". The Gst-nvdspostprocess guide names the pair:
# "setting output-tensor-meta as 1 ... and disabling parsing in the inference plugin by setting network-type as 100
# i.e. network type other". A classifier's keys (labelfile-path, classifier-threshold) mean nothing there.
DS_NETWORK_TYPE = {"classifier": 1, "other": 100}


def deepstream_config(manifest: Manifest, precision: str, batch: int, onnx_name: str, engine_name: str,
                      outputs: Sequence[str] = ("probs",)) -> str:
    """An nvinfer config for the float 0–255 NCHW variant (DeepStream only resizes): a classifier's (softmax
    ``probs`` out, labels) or, for an embedding model (``task_of``), a tensor-output one: network-type=100 with
    output-tensor-meta=1, so each frame/object carries its vector (and patch tokens) as NvDsInferTensorMeta."""
    task = task_of(manifest)
    pp = manifest.pp()
    h, w = pp.input_size
    resize_note = (
        "# resize: the model was trained on the whole image squashed to the input size (maintain-aspect-ratio=0)"
        if pp.resize_mode == "squash" else
        f"# resize: the model was trained on the image squashed to the input size / {pp.crop_pct}, then centre-cropped;\n"
        "# nvinfer squashes the whole frame/object instead (maintain-aspect-ratio=0): crop objects tightly to match."
        if pp.resize_mode == "squash_crop" else
        f"# resize: the model was trained with shorter-side resize and a centre crop ({pp.crop_pct}); nvinfer scales the\n"
        "# whole frame/object instead: crop objects tightly (or add nvdspreprocess) to match."
    )
    head = [
        "# nvinfer config written by `vitdeploy bundle`. Preprocessing (1/255, mean, std, layout) is inside",
        "# the ONNX graph, so DeepStream hands over raw RGB pixels: net-scale-factor=1, offsets=0.",
        "# Build the engine first with ../build_engine.sh --deepstream (else nvinfer builds it from onnx-file).",
        resize_note,
        "[property]",
        "gpu-id=0",
        "net-scale-factor=1.0",
        "offsets=0;0;0",
        f"model-color-format={1 if pp.channel_order == 'BGR' else 0}",
        f"onnx-file={onnx_name}",
        f"model-engine-file={engine_name}",
    ]
    common = [
        f"batch-size={batch}",
        f"# 0 FP32, 1 INT8, 2 FP16: this bundle's {precision} artifact",
        f"network-mode={DS_NETWORK_MODE[precision]}",
    ]
    geometry = [
        "process-mode=1",
        "gie-unique-id=1",
        f"infer-dims=3;{h};{w}",
        "network-input-order=0",
        f"maintain-aspect-ratio={0 if pp.resize_mode in ('squash', 'squash_crop') else 1}",
        f"scaling-filter={DS_SCALING_FILTER.get(pp.interpolation, 1)}",
    ]
    if task.is_embedding:
        what = f"{task.describe()}: " + ", ".join(outputs)
        return "\n".join([
            *head, *common,
            "# an embedding model: nvinfer does not parse its output (network-type=100, other) and attaches the raw",
            f"# tensors ({what}) to each frame/object as NvDsInferTensorMeta (output-tensor-meta=1);",
            "# read them in a pad probe (frame_user_meta_list / obj_user_meta_list, NVDSINFER_TENSOR_OUTPUT_META).",
            f"network-type={DS_NETWORK_TYPE['other']}",
            "output-tensor-meta=1",
            *geometry,
            f"output-blob-names={';'.join(outputs)}",
            "",
        ])
    return "\n".join([
        *head,
        "labelfile-path=labels.txt",
        *common,
        f"network-type={DS_NETWORK_TYPE['classifier']}",
        *geometry,
        f"output-blob-names={';'.join(outputs)}",
        "# the output is softmax probabilities; 0 keeps the top-1 label on every frame",
        "classifier-threshold=0.0",
        "",
    ])


def cpp_config(manifest: Manifest, default_model: str) -> str:
    """cpp/bundle.cfg: the manifest facts the C++ example reads, as key=value lines (no JSON library there).

    For an embedding model (``task_of``): ``task=embedding``, the output to read (``output=embedding``) and its width
    (``embedding_dim``); no labels. A classifier's file is as before tasks existed (no task line: a classifier)."""
    import PIL

    task = task_of(manifest)
    pp = manifest.pp()
    h, w = pp.input_size
    # the pass order of the Pillow that made this bundle's reference inputs (Pillow 13 changed it; see vitclassify.h)
    order = "pillow13" if int(PIL.__version__.split(".")[0]) >= 13 else "horizontal"
    facts: dict[str, Any] = {
        "input_height": h, "input_width": w, "resize_mode": pp.resize_mode, "crop_pct": repr(float(pp.crop_pct)),
        "interpolation": pp.interpolation, "resample_order": order, "channel_order": pp.channel_order,
    }
    if task.is_embedding:
        facts.update({"task": task.kind, "output": task.output, "embedding_dim": task.dim})
        if task.tokens:  # an export with --tokens: the example saves the patch tokens too (--out: FILE.patch_tokens.npy)
            facts["tokens"] = TOKENS_OUTPUT
    else:
        facts.update({"num_classes": manifest.num_classes, "labels": "../labels.txt"})
    facts.update({"engine": "../" + str(Path(default_model).with_suffix(".engine")), "batch": 8})
    if not task.is_embedding:
        facts["top"] = 1
    if pp.crop_offset != "round":  # transformers' centre crop; left out otherwise, so earlier bundles are unchanged
        facts["crop_offset"] = pp.crop_offset
    what = ("task/output/embedding_dim: the engine's output the example prints and saves (an embedding model, no "
            "labels);\n# engine is relative to this file; batch is run.py's --batch default.\n" if task.is_embedding else
            "labels and engine are relative to this file; batch and top are run.py's --batch and --top defaults.\n")
    return "".join([
        "# Written by `vitdeploy bundle`: the facts the C++ library and example (cpp/) read, one key=value a line.\n",
        "# The engine takes uint8 [batch, input_height, input_width, 3] RGB; scaling, mean/std, channel order and\n",
        "# layout are inside its graph. resize_mode/crop_pct/interpolation: run.py's resize and centre crop;\n",
        f"# resample_order: Pillow {PIL.__version__}'s order of the two resize passes (horizontal: Pillow <= 12).\n",
        f"# {what}",
        *(f"{k}={v}\n" for k, v in facts.items()),
    ])


def write_cpp(root: Path, manifest: Manifest, default_model: str) -> None:
    """cpp/: the C++ library and `classify` example (bundle_files/cpp) and the bundle.cfg they read."""
    shutil.copytree(TEMPLATES / "cpp", root / "cpp", ignore=shutil.ignore_patterns("build", "__pycache__"))
    (root / "cpp" / "bundle.cfg").write_text(cpp_config(manifest, default_model))


def render(template: str, values: dict[str, Any]) -> str:
    text = (TEMPLATES / template).read_text()
    for k, v in values.items():
        text = text.replace(f"@@{k}@@", str(v))
    left = re.findall(r"@@[A-Z_]+@@", text)
    if left:
        raise RuntimeError(f"{template}: unfilled placeholders {left}")
    return text
