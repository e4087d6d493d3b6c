"""`vitdeploy doctor`: what this machine can do, said correctly here (no TensorRT, no GPU) and on a Jetson tree."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitdeploy.cli import app
from vitdeploy.tools.doctor import command_support, doctor, jetpack_for, parse_tegra_release, probe_dla, probe_jetson


def gpu_here() -> bool:
    """An independent look: nvidia-smi lists a GPU (a Jetson's integrated GPU: L4T is installed)."""
    if Path("/etc/nv_tegra_release").exists():
        return True
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True, timeout=30).returncode == 0


def tensorrt_here() -> bool:
    r = subprocess.run([sys.executable, "-c", "import tensorrt; print(tensorrt.__version__)"], capture_output=True, timeout=120)
    return r.returncode == 0


needs_bare_machine = pytest.mark.skipif(gpu_here() or tensorrt_here(), reason="this machine has a GPU or TensorRT")


def test_doctor_agrees_with_an_independent_look() -> None:
    rep = doctor()
    assert rep.tensorrt["available"] == tensorrt_here()
    assert rep.cuda["available"] == gpu_here()
    assert rep.onnxruntime["available"] and "CPUExecutionProvider" in rep.onnxruntime["providers"]
    assert rep.packages["onnx"] and rep.packages["torch"]


@needs_bare_machine
def test_doctor_here_says_tensorrt_and_gpu_are_missing() -> None:
    rep = doctor()
    assert rep.tensorrt["available"] is False and "TensorRT" in rep.tensorrt["why"]
    assert rep.cuda["available"] is False and rep.cuda["gpus"] == []
    assert rep.jetson["is_jetson"] is False and rep.dla["cores"] == 0
    works = {c["command"]: c for c in rep.commands}
    assert works["build-engine"]["works"] == "partly"
    assert works["build-engine"]["why"].endswith(f"{rep.tensorrt['why']}, and {rep.cuda['why']}")  # build-engine's words
    assert works["infer / verify / benchmark"]["works"] == "partly"
    assert works["bundle"]["works"] == "yes" and works["export"]["works"] == "yes"
    assert works["train"]["works"] == "partly" and "CPU only" in works["train"]["why"]


@needs_bare_machine
def test_cli_doctor_screen_and_json(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["doctor"], terminal_width=160)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    trt = next(line for line in lines if "│ tensorrt " in line)
    gpu = next(line for line in lines if "│ gpu " in line)
    assert "missing" in trt and "missing" in gpu and "no CUDA driver" in gpu
    assert "build-engine" in r.output and "partly" in r.output
    r = CliRunner().invoke(app, ["doctor", "--json", "-"])
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert d["tensorrt"]["available"] is False and d["cuda"]["available"] is False
    out = tmp_path / "doctor.json"
    r = CliRunner().invoke(app, ["doctor", "--json", str(out)])
    assert r.exit_code == 0 and json.loads(out.read_text())["python"]["version"] == sys.version.split()[0]


def test_doctor_through_a_pipe_is_plain_words_and_lists_every_backend(tmp_path: Path) -> None:
    """No markup text such as `[yellow]partly[/]` reaches a pipe; OpenVINO (the default CPU backend) is listed."""
    import re

    r = subprocess.run([sys.executable, "-m", "vitdeploy", "doctor"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not re.search(r"\[/?(green|yellow|red|bold)[^\]]*\]|\[/\]", r.stdout), r.stdout
    assert "\x1b[" not in r.stdout  # no colour codes either
    rows = {line.split("│")[1].strip(): line for line in r.stdout.splitlines() if line.count("│") >= 4}
    assert {"openvino", "onnxruntime", "tensorrt", "torch"} <= set(rows)
    works = {c["command"]: c["works"] for c in doctor().commands}
    assert all(f" {w} " in next(line for line in r.stdout.splitlines() if f"│ {c} " in line) for c, w in works.items())
    d = json.loads(subprocess.run([sys.executable, "-m", "vitdeploy", "doctor", "--json", "-"], capture_output=True,
                                  text=True, timeout=300).stdout)
    ov = next(b for b in d["backends"] if b["backend"] == "openvino")
    assert ov["available"] == (d["packages"]["openvino"] is not None)
    assert ("ONNX models on the CPU" in ov["auto_picks"]) == ov["available"]


def test_doctor_does_not_import_torch() -> None:
    code = "import sys; from vitdeploy.tools.doctor import doctor; doctor(); print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def fake_jetson(root: Path, release: str, model: str, dla: int) -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "nv_tegra_release").write_text(release)
    (root / "proc" / "device-tree").mkdir(parents=True)
    (root / "proc" / "device-tree" / "model").write_bytes(model.encode() + b"\0")
    (root / "dev").mkdir()
    for i in range(dla):
        (root / "dev" / f"nvhost-nvdla{i}").write_text("")
        (root / "dev" / f"nvhost-ctrl-nvdla{i}").write_text("")
    return root


def test_jetson_release_and_dla_from_a_jetson_tree(tmp_path: Path) -> None:
    orin = fake_jetson(tmp_path / "orin", "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, "
                       "DATE: Tue Aug  1 19:57:35 UTC 2023\n", "NVIDIA Jetson AGX Orin Developer Kit", 2)
    j = probe_jetson(orin)
    assert j == {"is_jetson": True, "model": "NVIDIA Jetson AGX Orin Developer Kit", "l4t": "35.4.1",
                 "jetpack": "5.1.2", "jetpack_tensorrt": "8.5.2"}
    assert probe_dla(orin)["cores"] == 2
    nano = fake_jetson(tmp_path / "nano", "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic\n",
                       "NVIDIA Jetson Orin Nano Developer Kit", 0)
    j = probe_jetson(nano)
    assert (j["l4t"], j["jetpack"], j["jetpack_tensorrt"]) == ("36.4.0", "6.1 / 6.2", "10.3")
    assert probe_dla(nano)["cores"] == 0
    assert jetpack_for("99.1.0") == (None, None)
    assert parse_tegra_release("garbage") is None
    assert probe_jetson(tmp_path / "nothing")["is_jetson"] is False


def test_command_support_with_a_gpu_and_tensorrt() -> None:
    pk = {"torch": "2.4", "onnx": "1.16"}
    rows = {r["command"]: r["works"] for r in command_support(
        pk, {"available": True}, {"available": True}, {"available": True})}
    assert rows["build-engine"] == "yes" and rows["infer / verify / benchmark"] == "yes" and rows["train"] == "yes"
    rows = {r["command"]: r["works"] for r in command_support(
        {"onnx": "1.16"}, {"available": True}, {"available": True}, {"available": False})}
    assert rows["train"] == "no" and rows["export"] == "no" and rows["build-engine"] == "partly"
    assert rows["calibrate / convert-fp16"] == "yes" and rows["import / explain"] == "no"


def test_doctor_names_this_machines_target_and_what_it_builds() -> None:
    """The target from the installed TensorRT, else from JetPack's; DLA per the version table."""
    from vitdeploy.tools.doctor import machine_target

    jp5 = machine_target({"available": False}, {"available": False}, {"jetpack_tensorrt": "8.5.2", "jetpack": "5.1.2"})
    assert jp5["target"] == "trt8.5" and jp5["max_opset"] == 17 and jp5["dla"] is True
    assert set(jp5["engines"]) == {"fp32", "fp16", "int8", "raw-pixel", "deepstream"}
    assert all(v.startswith("artifacts only") for v in jp5["engines"].values())
    gpu = machine_target({"available": True, "version": "10.8.0.43"}, {"available": True}, {})
    assert gpu["target"] == "trt10" and gpu["dla"] is False and set(gpu["engines"].values()) == {"yes"}
    assert machine_target({"available": False}, {"available": False}, {})["target"] is None
