"""--target takes what users know (a JetPack, a Jetson module), through one table; impossible requests are refused
before any work; the target said once is recorded and inherited by the later steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitdeploy.cli import app
from vitdeploy.core import devices
from vitdeploy.core.errors import ImpossibleRequest, UnknownTarget, UsageError
from vitdeploy.core.targets import check_request, resolve_target

VENV_BIN = Path(sys.executable).parent
runner = CliRunner()


def vitdeploy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "vitdeploy"), *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.parametrize(("name", "line"), [
    ("jetpack5.1", "trt8.5"), ("JetPack 6.0", "trt8.6"), ("jp6.1", "trt10"), ("jetpack6.2-orin-nano", "trt10"),
    ("Jetson AGX Orin, JetPack 6.1", "trt10"), ("jetpack7.0", "trt10"), ("thor", "trt10"), ("trt10.3", "trt10"),
    ("tensorrt 8.6", "trt8.6"), ("trt11", "trt11"), ("ort", "cpu"), ("cpu", "cpu"), ("openvino", "openvino"), ("jetpack5.1.4 xavier-nx", "trt8.5"),
])
def test_device_names_resolve_to_the_tensorrt_line_their_jetpack_ships(name: str, line: str) -> None:
    facts = resolve_target(name)
    assert facts is not None and facts.name == line


def test_every_jetpack_row_names_an_nvidia_source_and_keeps_the_unconfirmed_marks() -> None:
    for jp in devices.JETPACKS:
        assert "NVIDIA" in jp.source
        facts = resolve_target(f"jetpack{jp.release}")
        assert facts is not None and facts.device is not None and facts.device.tensorrt == jp.tensorrt
        assert bool(facts.device.unconfirmed) == jp.unconfirmed  # an unconfirmed row says so wherever it is used
    for m in devices.MODULES:
        assert "NVIDIA" in m.source
    # shared/TENSORRT.md: 5.1 -> 8.5.2 and 6.1/6.2 -> 10.3 are confirmed; 6.0 and every 7.x are not
    assert {j.release for j in devices.JETPACKS if j.unconfirmed} == {"6.0", "7.0", "7.1", "7.2"}


@pytest.mark.parametrize("name", ["jetpack9.9", "orin-banana", "trt9", "jetpack6.1-orin-nano-x", "cuda"])
def test_an_unknown_name_is_one_line_listing_the_known_ones(name: str) -> None:
    with pytest.raises(UnknownTarget) as e:
        resolve_target(name)
    msg = str(e.value)
    assert "\n" not in msg and "trt8.5, trt8.6, trt10, trt11" in msg and "jetpack6.1" in msg and "orin-nano" in msg


def test_a_module_its_jetpack_does_not_support_is_impossible() -> None:
    with pytest.raises(ImpossibleRequest, match="JetPack 7.0 does not support the Jetson Orin Nano"):
        resolve_target("jetpack7.0-orin-nano")


def test_a_module_alone_resolves_only_where_its_jetpacks_ship_one_tensorrt() -> None:
    thor = resolve_target("thor")
    assert thor is not None and thor.name == "trt10" and thor.device is not None and thor.device.fp8
    with pytest.raises(UsageError, match="name the JetPack too"):
        resolve_target("orin-nano")


def test_impossible_requests_are_refused_and_possible_ones_pass() -> None:
    nano = resolve_target("jetpack6.1-orin-nano")
    agx = resolve_target("jetpack6.1-agx-orin")
    with pytest.raises(ImpossibleRequest, match="Orin Nano has no DLA"):
        check_request(nano, dla_core=0)
    check_request(agx, dla_core=1)
    with pytest.raises(ImpossibleRequest, match="2 DLA core"):
        check_request(agx, dla_core=2)
    with pytest.raises(ImpossibleRequest, match="one fixed batch"):
        check_request(agx, dla_core=0, int8=True, dynamic_batch=True)
    with pytest.raises(ImpossibleRequest, match="FP8"):
        check_request(agx, fp8=True)
    check_request(resolve_target("thor"), fp8=True)
    with pytest.raises(ImpossibleRequest, match="Thor has no DLA|has no DLA"):
        check_request(resolve_target("thor"), dla_core=0)
    # unconfirmed facts never refuse: TensorRT on JetPack 7.2 (10.16, or 11.4.1 with DLA from 7.2.2) is not confirmed
    check_request(resolve_target("jetpack7.2-agx-orin"), dla_core=0)
    check_request(resolve_target("jetpack5.1"), dla_core=0)  # no module named: nothing to refuse on


def test_unknown_target_exits_2_in_one_line_on_every_command_that_takes_one(tmp_path: Path) -> None:
    for cmd in (["export"], ["calibrate"], ["convert-fp16"], ["build-engine"], ["bundle"], ["check-target", "x.onnx"]):
        r = runner.invoke(app, [*cmd, "--target", "jetpack4.2"])
        assert r.exit_code == 2, (cmd, r.output)
        assert r.output.count("\n") == 1 and "unknown target 'jetpack4.2'" in r.output, (cmd, r.output)


def test_dla_on_orin_nano_exits_2_before_any_work(tmp_path: Path) -> None:
    r = vitdeploy("build-engine", "--int8", "--dla-core", "0", "--target", "JetPack 6.1 Orin Nano", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "Orin Nano has no DLA" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []  # refused before reading model.onnx (which is not even there)


def test_target_said_once_on_export_is_recorded_and_inherited(tiny_ckpt: Path, mixed_mode_folder: Path, tmp_path: Path) -> None:
    from vitdeploy.core.artifact import read_onnx_manifest

    onnx = tmp_path / "model.onnx"
    r = runner.invoke(app, ["export", str(tiny_ckpt), "-o", str(onnx), "--no-check", "-t", "jetpack6.1"])
    assert r.exit_code == 0, r.output
    assert "JetPack 6.1 (TensorRT 10.3) → trt10" in r.output and "next: vitdeploy build-engine" in r.output
    assert read_onnx_manifest(onnx).target == "trt10"  # the line, not the words the user typed
    r = runner.invoke(app, ["calibrate", str(onnx), "-i", str(mixed_mode_folder), "--num-images", "12", "-b", "4"])
    assert r.exit_code in (0, 3), r.output  # 3: the folder holds files in modes PIL reads as unreadable
    int8 = read_onnx_manifest(tmp_path / "model.int8.onnx")
    assert int8.target == "trt10" and int8.precision == "int8"
    out = tmp_path / "bundle"
    r = runner.invoke(app, ["bundle", str(onnx), str(tmp_path / "model.int8.onnx"), "-o", str(out), "-i",
                            str(mixed_mode_folder), "--references", "2"])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "manifest.json").read_text())["target"] == "trt10"


@pytest.fixture(scope="module")
def tiny_ckpt(mixed_mode_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cheapest checkpoint train makes (one epoch at 16x16 on 36 images)."""
    from vitdeploy.model.train import TrainOptions, train

    out = tmp_path_factory.mktemp("tiny") / "ckpt.pth"
    train(mixed_mode_folder, TrainOptions(epochs=1, out=out, preset="vit-digits", image_size=16, patch_size=4, batch_size=16))
    return out
