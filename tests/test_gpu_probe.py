"""The one GPU / TensorRT probe (libcuda through ctypes), asked by build-engine, doctor, infer and benchmark.

A stand-in libcuda (tests/fake_libcuda.py: a shared object compiled here, loaded through VITDEPLOY_LIBCUDA exactly as
libcuda.so.1 is) says how many devices there are; PATH holds no nvidia-smi, as on a Jetson that lacks it.
"""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import fake_libcuda
import pytest

from vitdeploy.runners.tensorrt import cuda
from vitdeploy.runners.tensorrt.probe import probe, tensorrt_usable


@pytest.fixture(scope="module")
def libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_libcuda.build(tmp_path_factory.mktemp("libcuda"))


@pytest.fixture
def no_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH without nvidia-smi (a Jetson may have none)."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert shutil.which("nvidia-smi") is None


@pytest.fixture
def tensorrt_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """An importable `tensorrt` that has bindings (import_tensorrt's test); nothing here calls into it."""
    trt = types.ModuleType("tensorrt")
    trt.Builder = object  # type: ignore[attr-defined]
    trt.__version__ = "10.3.0.30"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    return trt


def test_the_driver_lists_the_stand_in_device(libcuda: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_libcuda.use(monkeypatch, libcuda, devices=2)
    monkeypatch.setenv("FAKE_CUDA_NAME", "Jetson AGX Orin")
    found = cuda.gpu_probe()
    assert found.available and found.count == 2 and found.why is None and found.driver_cuda_version == "12.6"
    assert cuda.gpu_list(found) == [
        {"index": i, "name": "Jetson AGX Orin", "compute_capability": "8.7", "memory_gib": 8.0} for i in range(2)
    ]


def test_the_python_stand_in_answers_like_the_compiled_one(libcuda: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_libcuda.use(monkeypatch, libcuda, devices=2)
    compiled = cuda.gpu_list()
    fake_libcuda.install(monkeypatch, devices=2)
    assert cuda.gpu_list() == compiled and cuda.gpu_probe().driver_cuda_version == "12.6"


@pytest.mark.parametrize(("devices", "init", "detail"), [
    (0, 0, "the CUDA driver lists no device"),
    (1, 100, "the CUDA driver did not start: cuInit CUDA_ERROR_NO_DEVICE (100)"),
])
def test_no_gpu_is_one_reason_in_the_drivers_words(libcuda: Path, monkeypatch: pytest.MonkeyPatch, devices: int,
                                                    init: int, detail: str) -> None:
    fake_libcuda.use(monkeypatch, libcuda, devices=devices, init=init)
    found = cuda.gpu_probe()
    assert not found.available and found.why == f"no CUDA GPU ({detail})" and cuda.gpu_list(found) == []
    assert cuda.gpu_info() == found.why  # what benchmark --device cuda and the builder say


def test_no_driver_library_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda, "_LIBCUDA_NAMES", ("/nonexistent/libcuda.so.1",))
    monkeypatch.delenv("VITDEPLOY_LIBCUDA", raising=False)
    assert cuda.gpu_probe().why == "no CUDA GPU (no CUDA driver: /nonexistent/libcuda.so.1 not found)"


def test_infer_picks_the_engine_when_libcuda_lists_a_gpu_without_nvidia_smi(
        libcuda: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_smi: None,
        tensorrt_module: types.ModuleType) -> None:
    from vitdeploy.tools.infer import candidate_models

    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("model.onnx", "model.int8.onnx", "model.fp16.engine"):
        (folder / name).write_bytes(b"x")
    fake_libcuda.use(monkeypatch, libcuda, devices=1)
    assert tensorrt_usable()
    assert candidate_models(folder)[0].name == "model.fp16.engine"
    fake_libcuda.use(monkeypatch, libcuda, devices=0)  # the same machine with no GPU: ONNX first
    assert not tensorrt_usable()
    assert all(p.suffix == ".onnx" for p in candidate_models(folder))


def test_benchmark_lists_the_gpus_the_driver_lists(libcuda: Path, monkeypatch: pytest.MonkeyPatch,
                                                   no_smi: None) -> None:
    from vitdeploy.tools.bench import gpu_names, machine_info

    fake_libcuda.use(monkeypatch, libcuda, devices=1)
    assert gpu_names() == ["Fake Orin"] and machine_info()["gpu"] == ["Fake Orin"]
    fake_libcuda.use(monkeypatch, libcuda, devices=0)
    assert gpu_names() == [] and machine_info()["gpu"] is None


def test_doctor_and_build_engine_give_the_same_reason(libcuda: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With no TensorRT here and a driver that lists no device, both say the probe's words, once, in the same order."""
    import onnx
    from onnx import TensorProto, helper

    from vitdeploy.core.manifest import Manifest, set_onnx_manifest
    from vitdeploy.core.preprocess import Preprocess
    from vitdeploy.stages.engine import BuildOptions, EngineNotBuilt, build_engine
    from vitdeploy.tools.doctor import doctor, engine_missing

    fake_libcuda.use(monkeypatch, libcuda, devices=1, init=100)
    gpu_why = "no CUDA GPU (the CUDA driver did not start: cuInit CUDA_ERROR_NO_DEVICE (100))"
    graph = helper.make_graph([helper.make_node("Flatten", ["pixel_values"], ["logits"], axis=1)], "flat",
                              [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 2, 2])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 12])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    set_onnx_manifest(model, Manifest(model={"num_classes": 12, "image_size": [2, 2]}, labels=[str(i) for i in range(12)],
                                      preprocess=Preprocess(input_size=(2, 2)).to_dict(), name="flat", precision="fp32"))
    onnx.save(model, str(tmp_path / "model.onnx"))

    rep = doctor()
    assert rep.cuda["why"] == gpu_why and not rep.cuda["available"]
    with pytest.raises(EngineNotBuilt) as e:
        build_engine(tmp_path / "model.onnx", BuildOptions())
    said = engine_missing(rep.tensorrt, rep.cuda)
    assert e.value.missing == said == probe().missing
    assert said.endswith(gpu_why) and said.count("no CUDA GPU") == 1
    rows = {r["command"]: r["why"] for r in rep.commands}
    assert rows["build-engine"].endswith(said) and rows["infer / verify / benchmark"].endswith(said)
    assert next(b for b in rep.backends if b["backend"] == "tensorrt")["why"] == said
