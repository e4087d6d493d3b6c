"""Every trtexec line build-engine prints builds the artifact as intended on the TensorRT it names: the artifact passes
that TensorRT's check-target rules, and the line's options exist in that trtexec; a TensorRT that would not gets the
command that re-makes the artifact for it instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vitdeploy.checks import conformance
from vitdeploy.core import trt_table
from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.targets import target_of_version
from vitdeploy.runners.tensorrt.builder import BuildSpec
from vitdeploy.runners.tensorrt.commands import finish_commands
from vitdeploy.runners.tensorrt.versions import make_profile
from vitdeploy.stages.engine import refusal

VERSION_OF_LABEL = {"TensorRT 10+": "10.0", "TensorRT 8.5/8.6": "8.5", "TensorRT 8.6": "8.6", "TensorRT 8.5": "8.5"}


def _lines(path: Path) -> list[str]:
    art = OnnxArtifact.open(path)
    spec = BuildSpec(art.path, path.with_suffix(".engine"), art.input.name, list(art.input.dims), make_profile(),
                     art.manifest.precision, None, None, None, False)
    return finish_commands(spec, art.opset, refusal(art))


@pytest.mark.parametrize("kind", ["fp32", "fp16", "int8"])
def test_each_printed_trtexec_line_passes_check_target_for_its_tensorrt(digits_artifacts: Path, kind: str) -> None:
    path = digits_artifacts / {"fp32": "model.onnx", "fp16": "model.fp16.onnx", "int8": "model.int8.onnx"}[kind]
    lines = _lines(path)
    assert lines[0].startswith("vitdeploy build-engine")
    named = set()
    for line in lines[1:]:
        m = re.match(r"# or, (TensorRT [^:]+):  trtexec ", line) or re.match(r"# not for (TensorRT .+?) as made", line)
        assert m, line
        label = m.group(1)
        version = VERSION_OF_LABEL[label]
        named.add(version)
        target = target_of_version(version)
        model = OnnxArtifact.open(path).model
        passes = conformance.check_onnx(model, target).ok and conformance.check_int8_intent(model, target).ok
        if line.startswith("# or,"):
            assert passes, f"{line[:80]}: {path.name} fails check-target {target}"
            flags = conformance.trtexec_flags_of(line)
            assert not conformance.check_trtexec_flags(flags, trt_table.row_of(version)), line
        else:
            assert not passes and f"--target {target}" in line, line
    assert "10.0" in named and "8.5" in named  # every TensorRT line is spoken for


def test_the_default_int8_names_the_remake_for_strongly_typed_tensorrt(digits_artifacts: Path) -> None:
    """The default INT8 (float32 scales, LayerNormalization) is not built with --stronglyTyped on 10+ or parsed on 8.5:
    those lines say how to re-make it instead."""
    text = "\n".join(_lines(digits_artifacts / "model.int8.onnx"))
    assert "--stronglyTyped" not in text
    assert "--target trt10" in text and "--target trt8.5" in text
