"""Each command reads each artifact once: counted with the real onnx.load and ONNX Runtime wrapped, on real files.

(The bundle's count, each file hashed once, is in tests/test_bundle.py; the guard's, each weight quantized once, in
tests/test_precision.py.)
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import pytest

from vitdeploy.stages.engine import BuildOptions, EngineNotBuilt, build_engine

CALIB = Path(__file__).resolve().parents[1] / "calibration"


@pytest.fixture
def fp32(digits_onnx: Path) -> Path:
    return digits_onnx  # copied into tmp_path by each test before use


def _counted(monkeypatch: pytest.MonkeyPatch) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Counters of model reads per file (onnx.load, and core.loaded.read_hashed, which OnnxArtifact reads a graph's
    bytes with), ONNX Runtime sessions per file, and image decodes per image file."""
    import vitdeploy.core.preprocess as preprocess

    loads: Counter[str] = Counter()
    sessions: Counter[str] = Counter()
    decodes: Counter[str] = Counter()
    real_load, real_session, real_decode = onnx.load, ort.InferenceSession, preprocess.load_image

    def counted_decode(path: Any) -> Any:
        decodes[Path(str(path)).name] += 1
        return real_decode(path)

    def counted_load(f: Any, *a: Any, **k: Any) -> Any:
        loads[Path(str(f)).name] += 1
        return real_load(f, *a, **k)

    class CountedSession(real_session):  # type: ignore[misc, valid-type]
        def __init__(self, src: Any, *a: Any, **k: Any) -> None:
            sessions[Path(src).name if isinstance(src, (str, Path)) else "<in memory>"] += 1
            super().__init__(src, *a, **k)

    import vitdeploy.core.loaded as loaded

    real_read = loaded.read_hashed

    def counted_read(f: Any) -> Any:  # the one reader of a model's bytes (hashed as they are read), counted as a load
        if Path(str(f)).suffix == ".onnx":
            loads[Path(str(f)).name] += 1
        return real_read(f)

    monkeypatch.setattr(onnx, "load", counted_load)
    monkeypatch.setattr(loaded, "read_hashed", counted_read)
    monkeypatch.setattr(ort, "InferenceSession", CountedSession)
    monkeypatch.setattr(preprocess, "load_image", counted_decode)
    return loads, sessions, decodes


@pytest.mark.parametrize("flags", [{"int8": True}, {"fp16": True}, {}], ids=["int8", "fp16", "as-is"])
def test_build_engine_reads_its_source_onnx_once(fp32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 flags: dict[str, bool]) -> None:
    """Without TensorRT: make the precision artifact, check it, print the commands (exit 3) — the source ONNX is read
    once, the artifact written is not read back, and ONNX Runtime opens each file at most once (the check)."""
    src = tmp_path / "model.onnx"
    shutil.copy(fp32, src)
    loads, sessions, decodes = _counted(monkeypatch)
    calib = tmp_path / "calib"
    calib.mkdir()
    for f in sorted(CALIB.glob("*.png"))[:40]:
        shutil.copy(f, calib / f.name)
    try:
        build_engine(src, BuildOptions(calib=calib, **flags))
    except EngineNotBuilt as e:
        assert e.artifact.is_file()
    else:  # a machine with TensorRT and a GPU built it: the counts below still hold for the artifact step
        pass
    assert loads["model.onnx"] == 1, dict(loads)
    made = {"int8": "model.int8.onnx", "fp16": "model.fp16.onnx"}.get(next(iter(flags), ""), None)
    if made:
        assert loads[made] == 0, dict(loads)
        assert sessions["model.onnx"] <= 1 and sessions[made] <= 1, dict(sessions)
    assert sum(loads.values()) == 1, dict(loads)
    if "int8" in flags:  # calibration and the artifact's check share one decode of each calibration image
        assert decodes and max(decodes.values()) == 1, dict(decodes)
        assert set(decodes) <= {f.name for f in calib.iterdir()}
