"""The engine's precision receipt, read only from inspector outputs NVIDIA published or users pasted in public issues.

Sources of every file: tests/data/inspector/README.md (NVIDIA/TensorRT trex examples, NVIDIA/TensorRT#4397,
NVIDIA/trt-samples-for-hackathon-cn#18).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vitdeploy.runners.tensorrt.inspector import judge, receipt_from_json

DATA = Path(__file__).parent / "data" / "inspector"


def _receipt(name: str):  # type: ignore[no-untyped-def]
    return receipt_from_json((DATA / name).read_text())


def test_every_file_used_here_is_named_with_its_source() -> None:
    readme = (DATA / "README.md").read_text()
    for f in DATA.iterdir():
        if f.name != "README.md":
            assert f"`{f.name}`" in readme


@pytest.mark.parametrize(("name", "precision"), [
    ("trex-resnet18-A100-fp32.graph.json", "FP32"),
    ("trex-resnet18-A100-fp16.graph.json", "FP16"),
    ("trex-resnet18-A100-qat.graph.json", "INT8"),
])
def test_gemm_flops_fall_in_the_precision_the_engine_was_built_with(name: str, precision: str) -> None:
    r = _receipt(name)
    d = r.to_dict()
    assert d["status"] == "ok" and d["source"] == "json"
    assert d["gemm_layers"] == 21  # ResNet-18: 20 convolutions and the classifier (a 1×1 convolution here)
    assert d["gemm_share"] == {precision: 1.0}
    # ResNet-18 at 224×224 is 1.81 G multiply-adds per image (torchvision); these engines run batch 32
    per_image_macs = sum(d["gemm_flops"].values()) / 2 / 32
    assert per_image_macs == pytest.approx(1.81e9, rel=0.01)
    assert d["attention"]["fused"] is None  # a CNN: no attention to fuse
    json.dumps(d, allow_nan=False)


def test_judge_fails_a_build_whose_gemms_missed_the_requested_precision() -> None:
    fp32, fp16, qat = (_receipt(f"trex-resnet18-A100-{p}.graph.json") for p in ("fp32", "fp16", "qat"))
    assert judge(qat, "int8") is None
    assert judge(fp16, "fp16") is None and judge(qat, "fp16") is None  # INT8 counts as at or below FP16
    why = judge(fp16, "int8")
    assert why is not None and "INT8" in why and "0.0%" in why and "FP16 100.0%" in why
    why = judge(fp32, "fp16")
    assert why is not None and "FP32 100.0%" in why
    assert judge(fp32, "fp32") is None


def test_fp32_layers_are_named_and_format_conversions_are_not() -> None:
    fp32, fp16, qat = (_receipt(f"trex-resnet18-A100-{p}.graph.json") for p in ("fp32", "fp16", "qat"))
    assert fp16.fp32_layers == []  # its FP32 input is only reformatted to FP16
    assert "Conv_0 + Relu_1" in fp32.fp32_layers
    assert qat.fp32_layers == ["MaxPool_12"]  # the one layer the QAT engine runs on FP32 data


def test_myelin_layers_and_a_fused_attention_kernel_are_read_from_the_one_line_form() -> None:
    r = _receipt("trt-issue-4397-bert-oneline.txt")
    d = r.to_dict()
    assert d["status"] == "ok" and d["source"] == "oneline" and d["layers"] == 5
    assert d["attention"]["fused"] is True and "_gemm_mha_v2_myl0_24" in d["attention"]["evidence"]
    by_name = {la.name: la for la in r.layers}
    # [1,40,1024] → [1,40,256]: 2·40·256·1024; the QKV GEMM [1,40,256] → [3,40,256]: 2·3·40·256·256
    assert by_name["/encoder/layers_0/pos_ff/output/MatMul_myl0_7"].flops == 2 * 40 * 256 * 1024
    # attention over 4 heads of 40 tokens × 64: Q·Kᵀ and P·V
    assert by_name["_gemm_mha_v2_myl0_24"].flops == 2 * (2 * 4 * 40 * 64 * 40)
    # a layer whose ONNX path merely contains "/mha/" is a GEMM, not the attention kernel
    assert by_name["/encoder/layers_3/mha/output/dense/MatMul_myl0_25"].kind == "gemm"
    assert d["gemm_share"] == {"FP16": 1.0}
    # the reporter's point: an INT8-quantized BERT whose GEMMs all ran in Half
    assert judge(r, "int8") is not None and judge(r, "fp16") is None


def test_names_only_or_unreadable_information_gives_unknown_never_a_guess() -> None:
    r = _receipt("trt-hackathon-cn-issue-18-names-only.json")
    assert r.to_dict()["status"] == "unknown" and "detailed" in r.reason
    assert judge(r, "int8") is None
    for text in ("", "not json", "{}", '{"Layers": []}', "[1, 2]"):
        assert receipt_from_json(text).to_dict()["status"] == "unknown"
    with pytest.raises(ValueError):
        judge(_receipt("trex-resnet18-A100-qat.graph.json"), "int3")
