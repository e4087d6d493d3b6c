"""The engine's precision receipt: what TensorRT actually runs, read from its engine inspector.

TensorRT decides kernels and their precisions at build time; a build asked for INT8 or FP16 can
come out in FP32 without an error (NVIDIA/TensorRT#4590, roboflow/rf-detr#1453). The only record
of what was built is the engine's layer information:
``ICudaEngine.create_engine_inspector().get_engine_information(LayerInformationFormat.JSON)`` on an
engine built with ``ProfilingVerbosity.DETAILED`` (trtexec ``--profilingVerbosity=detailed
--exportLayerInfo=FILE``). Both names exist in every binding from 8.6.1 to 11.4
(``shared/trt-api/*.json``). This module reads that text and nothing else: no TensorRT import.

What is read, and from where (NVIDIA/TensorRT ``tools/experimental/trt-engine-explorer``, "trex",
last present before commit 82d1dca8):

* a detailed JSON is ``{"Layers": [{...}], "Bindings": [...]}``; each layer has ``Name``,
  ``LayerType``, ``Inputs``/``Outputs`` with ``Dimensions`` and ``Format/Datatype``, and, for
  TensorRT's own layers, ``ParameterType`` (``Convolution``, ...), ``Kernel``, ``Groups``,
  ``TacticName``. Without detailed verbosity ``Layers`` is a list of names only: the receipt is
  then "unknown" (no precision can be read from a name).
* a layer's precision is its first input's data type (trex ``layer.py``: ``self.precision =
  self.inputs[0].precision``), read from the format string as trex ``activations.py`` does
  ("... Int8 format", "Row major linear FP32", and Myelin's bare "Half"/"Float"/"Int8").
* convolution FLOPs are 2 × N·K·P·Q·C·R·S / G (trex ``df_preprocessing.annotate_convolutions``
  counts those MACs); a GEMM's are 2 × (output elements) × K, K the reduced dimension of its
  first input; a fused attention kernel's are its two GEMMs, Q·Kᵀ and P·V.
* Myelin's layers (TensorRT 10 ``gemm``/``kgen``) and its fused attention kernel ``_gemm_mha_v2``
  are as trtexec printed them in NVIDIA/TensorRT#4397. That issue shows them in the one-line
  form (``LayerInformationFormat.ONELINE``, trtexec ``--dumpLayerInfo``), which is read too.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

UNKNOWN = "unknown"
OK = "ok"
# The share of GEMM FLOPs that must run in the requested precision (issue: "INT8 asked and under 90%").
REQUIRED_SHARE = 0.9

# Data types as trex's activations.py maps format strings (longest names first: BFloat16 before Float).
_DTYPES = (
    ("bfloat16", "BF16"), ("fp16", "FP16"), ("half", "FP16"), ("fp32", "FP32"), ("float", "FP32"),
    ("int8", "INT8"), ("fp8", "FP8"), ("fp4", "FP4"), ("int4", "INT4"), ("int32", "INT32"), ("int64", "INT64"),
    ("uint8", "UINT8"), ("bool", "BOOL"), ("double", "FP64"),
)
# Data-movement layers: they convert formats, they compute nothing a precision request is about.
_MOVERS = {"reformat", "noop", "shuffle", "constant", "slice", "concatenation", "identity"}
# A fused attention kernel's tactic or name: Myelin's "_gemm_mha_v2..." (NVIDIA/TensorRT#4397), "fmha..."
# plugins/kernels; "/mha/" inside an ONNX path (a layer *named* after a module) does not match.
_ATTN_KERNEL = re.compile(r"(?:^|_)f?mha(?:_|v\d|$)", re.I)


def _dtype(fmt: str) -> str | None:
    """The data type a ``Format/Datatype`` string names (None when it names none)."""
    words = re.findall(r"[a-z0-9]+", fmt.lower())
    for key, name in _DTYPES:
        if key in words:
            return name
    return None


@dataclass
class LayerInfo:
    """One engine layer as the inspector describes it."""

    name: str
    type: str  # LayerType (CaskConvolution, gemm, kgen, Myelin, ...)
    kind: str  # "gemm", "attention" (a fused attention kernel), "opaque" (a Myelin ForeignNode) or "other"
    precision: str | None  # the first input's data type
    inputs: list[tuple[list[int], str]] = field(default_factory=list)  # (dims, format)
    outputs: list[tuple[list[int], str]] = field(default_factory=list)
    tactic: str = ""
    flops: int | None = None  # GEMM/attention FLOPs where the dimensions give them

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "kind": self.kind, "precision": self.precision,
                "flops": self.flops}


@dataclass
class Receipt:
    """What the engine runs: the share of GEMM FLOPs per precision, fused attention, the FP32 layers.

    ``status`` is "unknown" (with ``reason``) when the layer information cannot tell: nothing is guessed.
    """

    status: str
    reason: str = ""
    source: str = ""  # "json" or "oneline"
    layers: list[LayerInfo] = field(default_factory=list)

    @property
    def gemm_layers(self) -> list[LayerInfo]:
        return [la for la in self.layers if la.kind in ("gemm", "attention")]

    @property
    def gemm_flops(self) -> dict[str, int]:
        """GEMM FLOPs per precision, over the GEMM layers whose dimensions give them."""
        out: dict[str, int] = {}
        for la in self.gemm_layers:
            if la.flops is not None:
                key = la.precision or UNKNOWN
                out[key] = out.get(key, 0) + la.flops
        return out

    @property
    def gemm_share(self) -> dict[str, float] | None:
        """Each precision's share of the GEMM FLOPs (None when no GEMM's FLOPs are known)."""
        f = self.gemm_flops
        total = sum(f.values())
        return {k: v / total for k, v in sorted(f.items())} if total else None

    @property
    def attention(self) -> dict[str, Any]:
        """Whether attention runs as one fused kernel: True, False, or None (no attention seen / cannot tell)."""
        fused = [la.name for la in self.layers if la.kind == "attention"]
        if fused:
            return {"fused": True, "evidence": f"{len(fused)} fused attention kernel(s), e.g. {fused[0]}"}
        foreign = [la.name for la in self.layers if la.kind == "opaque" and "softmax" in la.name.lower()]
        if foreign:
            return {"fused": True, "evidence": f"a Myelin ForeignNode spans Softmax ({foreign[0]}): one engine layer, "
                                               "its kernels not listed"}
        softmax = [la.name for la in self.layers if "softmax" in (la.type + " " + la.name).lower()]
        if softmax:
            return {"fused": False, "evidence": f"Softmax runs as its own layer ({softmax[0]})"}
        return {"fused": None, "evidence": "no attention layer in the layer information"}

    @property
    def fp32_layers(self) -> list[str]:
        """Layers that compute in FP32 (format conversions and no-ops left out)."""
        return [la.name for la in self.layers if la.precision == "FP32" and la.type.lower() not in _MOVERS]

    def to_dict(self) -> dict[str, Any]:
        """The receipt as the sidecar records it (strict JSON)."""
        if self.status != OK:
            return {"status": self.status, "reason": self.reason}
        share = self.gemm_share
        return {
            "status": self.status,
            "source": self.source,
            "layers": len(self.layers),
            "gemm_layers": len(self.gemm_layers),
            "gemm_flops": self.gemm_flops,
            "gemm_share": {k: round(v, 4) for k, v in share.items()} if share else None,
            "gemm_layers_without_flops": [la.name for la in self.gemm_layers if la.flops is None],
            "attention": self.attention,
            "fp32_layers": self.fp32_layers,
        }


# --- reading ------------------------------------------------------------------------------------


def _prod(dims: list[int]) -> int:
    return int(math.prod(dims)) if dims and all(d > 0 for d in dims) else 0


def _reduced_dim(a: list[int], b: list[int] | None) -> int | None:
    """K of A·B from the dims given: A's last dim, checked against B's when B is listed."""
    if not a:
        return None
    if b is None or len(b) < 2:
        return a[-1]
    for k in (a[-1], a[-2] if len(a) >= 2 else None):
        if k is not None and k in (b[-2], b[-1]):
            return k
    return None


def _flops(kind: str, raw: dict[str, Any], inputs: list[tuple[list[int], str]],
           outputs: list[tuple[list[int], str]]) -> int | None:
    """FLOPs of a GEMM-like layer from its dims (None when they do not give them)."""
    if not inputs or not outputs:
        return None
    x, y = inputs[0][0], outputs[0][0]
    if kind == "attention":  # Q [b,s,d], Kᵀ [b,d,s2] (or K [b,s2,d]), ..., out [b,s,dv]
        if len(inputs) < 2 or len(x) < 3 or len(inputs[1][0]) != len(x):
            return None
        k = inputs[1][0]
        s2 = k[-1] if k[-2] == x[-1] else (k[-2] if k[-1] == x[-1] else None)
        if s2 is None:
            return None
        return 2 * _prod(x) * s2 + 2 * _prod(y) * s2
    if "Kernel" in raw and len(x) >= 3 and len(y) >= 3:  # convolution: trex's implicit-GEMM MACs, × 2
        groups = int(raw.get("Groups", 1) or 1)
        return 2 * _prod(y) * x[1] * _prod([int(v) for v in raw["Kernel"]]) // groups
    b = inputs[1][0] if len(inputs) > 1 and len(inputs[1][0]) >= 2 else None
    red = _reduced_dim(x, b)
    return 2 * _prod(y) * red if red else None


def _kind(name: str, ltype: str, ptype: str, tactic: str) -> str:
    t = f"{ltype} {ptype}".lower()
    if _ATTN_KERNEL.search(tactic or name) or "attention" in t:
        return "attention"
    if ltype.lower() == "myelin" or name.startswith("{ForeignNode["):
        return "opaque"
    if any(w in t for w in ("convolution", "matrixmultiply", "fullyconnected")) or ltype.lower() == "gemm":
        return "gemm"
    return "other"


def _layer(raw: dict[str, Any]) -> LayerInfo:
    def tensors(key: str) -> list[tuple[list[int], str]]:
        return [([int(d) for d in t.get("Dimensions", [])], str(t.get("Format/Datatype", ""))) for t in raw.get(key, [])]

    name, ltype = str(raw.get("Name", "")), str(raw.get("LayerType", ""))
    ptype, tactic = str(raw.get("ParameterType", "")), str(raw.get("TacticName", ""))
    inputs, outputs = tensors("Inputs"), tensors("Outputs")
    kind = _kind(name, ltype, ptype, tactic)
    prec = _dtype(inputs[0][1]) if inputs else None
    flops = _flops(kind, raw, inputs, outputs) if kind in ("gemm", "attention") else None
    return LayerInfo(name, ltype or ptype, kind, prec, inputs, outputs, tactic, flops)


_ONELINE_HEAD = re.compile(r"^Name: (.*), LayerType: (.*)$")
_ONELINE_TACTIC = re.compile(r"TacticName: ([^,]*)")
_ONELINE_TENSOR = re.compile(r"\{ Name: (.*?), Dimensions: \[([-\d,]*)\], Format/Datatype: (.*?) \}")


def _oneline_layers(text: str) -> list[dict[str, Any]]:
    """Layers of the one-line form (``Name: ..., LayerType: ..., Inputs: [ { ... }], Outputs: [...], ...``)."""
    out = []
    for line in text.splitlines():
        head, sep, rest = line.strip().partition(", Inputs: [")
        m = _ONELINE_HEAD.match(head)
        if not sep or m is None:
            continue
        ins, _, rest = rest.partition("], Outputs: [")
        outs, _, tail = rest.partition("}]")
        tactic = _ONELINE_TACTIC.search(tail)

        def tensors(s: str) -> list[dict[str, Any]]:
            return [{"Name": n, "Dimensions": [int(d) for d in dims.split(",") if d], "Format/Datatype": f}
                    for n, dims, f in _ONELINE_TENSOR.findall(s)]

        out.append({"Name": m.group(1), "LayerType": m.group(2), "TacticName": tactic.group(1).strip() if tactic else "",
                    "Inputs": tensors(ins), "Outputs": tensors(outs + "}")})
    return out


def receipt_from_json(text: str) -> Receipt:
    """The receipt of an engine from its inspector output (JSON, or the one-line form); "unknown" when unreadable."""
    try:
        doc = json.loads(text)
    except (ValueError, TypeError):
        raws = _oneline_layers(text) if isinstance(text, str) else []
        if not raws:
            return Receipt(UNKNOWN, "the layer information is neither the inspector's JSON nor its one-line form")
        return Receipt(OK, source="oneline", layers=[_layer(r) for r in raws])
    layers = doc.get("Layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or not layers:
        return Receipt(UNKNOWN, "no \"Layers\" in the layer information")
    if not all(isinstance(la, dict) for la in layers):
        return Receipt(UNKNOWN, "the layer information lists layer names only: build the engine with detailed "
                                "profiling verbosity (ProfilingVerbosity.DETAILED, trtexec --profilingVerbosity=detailed)")
    return Receipt(OK, source="json", layers=[_layer(la) for la in layers])


def engine_information(engine: Any) -> str:
    """The inspector JSON of a deserialized engine (``ICudaEngine``), as ``receipt_from_json`` reads it.

    ``create_engine_inspector`` and ``LayerInformationFormat.JSON`` exist in every binding 8.6.1 … 11.4
    (shared/trt-api). On an engine built without detailed verbosity TensorRT lists names only.
    """
    import tensorrt as trt

    inspector = engine.create_engine_inspector()
    return str(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


# --- judging ------------------------------------------------------------------------------------

# What each requested precision lets the GEMMs run in (INT8 builds also run FP16/FP32 islands: only INT8 counts).
_ACCEPTED = {"int8": ("INT8",), "fp16": ("FP16", "INT8", "BF16", "FP8", "FP4"), "fp8": ("FP8", "FP4"), "fp4": ("FP4",)}


def judge(receipt: Receipt, requested_precision: str, required_share: float = REQUIRED_SHARE) -> str | None:
    """Why the engine misses the requested precision, or None when it meets it.

    An "unknown" receipt (or one without any GEMM FLOPs to count) is not judged: None, and the receipt says
    "unknown". ``fp32`` is always met. For ``int8``, under ``required_share`` of the GEMM FLOPs in INT8
    fails; for ``fp16``, under that share in FP16 or lower.
    """
    want = requested_precision.lower()
    if want in ("fp32", "tf32") or receipt.status != OK:
        return None
    if want not in _ACCEPTED:
        raise ValueError(f"unknown precision {requested_precision!r}: one of fp32, fp16, int8, fp8, fp4")
    share = receipt.gemm_share
    if share is None:
        return None
    got = sum(v for k, v in share.items() if k in _ACCEPTED[want])
    if got >= required_share:
        return None
    parts = ", ".join(f"{k} {v:.1%}" for k, v in sorted(share.items(), key=lambda kv: -kv[1]))
    return (f"{want.upper()} was requested but {got:.1%} of the GEMM FLOPs run in {'/'.join(_ACCEPTED[want])} "
            f"(under {required_share:.0%}): {parts}")
