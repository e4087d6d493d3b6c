"""mypy over the TensorRT modules against the published tensorrt-stubs (10.13 API).

The wheel as published cannot be used by mypy directly: its ``tensorrt/`` folder has no ``py.typed``
(so mypy skips it) and ``tensorrt_bindings/tensorrt.pyi`` has syntax errors (parameters named ``in``,
a required parameter after defaults). The test copies the stubs, fixes exactly those two things, and
points mypy at the copy; a deliberately wrong call proves the stubs are in force.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["vitdeploy/runners/tensorrt/versions.py", "vitdeploy/runners/tensorrt/cuda.py", "vitdeploy/stages/engine.py", "vitdeploy/runners/tensorrt/runner.py",
           "vitdeploy/cli/engine.py"]


def _stub_dirs() -> tuple[Path, Path] | None:
    spec = importlib.util.find_spec("tensorrt_stubs")
    if spec is None or not spec.submodule_search_locations:
        return None
    site = Path(list(spec.submodule_search_locations)[0]).parent
    trt, bindings = site / "tensorrt", site / "tensorrt_bindings"
    if not (trt / "__init__.pyi").exists() or not (bindings / "tensorrt.pyi").exists():
        return None
    return trt, bindings


def _fixed_stubs(dest: Path) -> Path:
    dirs = _stub_dirs()
    assert dirs is not None
    for src in dirs:
        (dest / src.name).mkdir(parents=True)
        for f in src.glob("*.pyi"):
            s = f.read_text()
            s = re.sub(r"([(,]\s*)in: ", r"\1in_: ", s)  # `in` is a keyword: not a valid parameter name
            s = s.replace(", channel_axis: int)", ", channel_axis: int = ...)")
            (dest / src.name / f.name).write_text(s)
    return dest


def _mypy(tmp_path: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    stubs = _fixed_stubs(tmp_path / "stubs")
    cfg = tmp_path / "mypy.ini"
    cfg.write_text(
        "[mypy]\npython_version = 3.11\nignore_missing_imports = True\nfollow_imports = silent\n"
        f"mypy_path = {stubs}\ncache_dir = {ROOT / '.mypy_cache' / 'trt'}\n"
        "[mypy-tensorrt,tensorrt.*,tensorrt_bindings,tensorrt_bindings.*]\nignore_errors = True\n"
        "[mypy-torch,torch.*,transformers,transformers.*,onnxruntime,onnxruntime.*]\nfollow_imports = skip\n"
    )
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(cfg), *targets], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed"),
    pytest.mark.skipif(_stub_dirs() is None, reason="tensorrt-stubs is not installed (pip install --no-deps tensorrt-stubs)"),
]


def test_tensorrt_modules_type_check_against_tensorrt_stubs(tmp_path: Path) -> None:
    bad = tmp_path / "uses_removed_api.py"
    bad.write_text(
        "import tensorrt as trt\n\n\ndef f() -> None:\n"
        "    b = trt.Builder(trt.Logger(trt.Logger.WARNING))\n"
        "    b.build_engine(b.create_network(0), b.create_builder_config())\n"
    )
    r = _mypy(tmp_path, *MODULES, str(bad))
    out = r.stdout + r.stderr
    # the stubs are in force: the call TensorRT 10 removed is caught ...
    assert '"Builder" has no attribute "build_engine"' in out, out
    # ... and it is the only error: every TensorRT call in our modules matches the stubs
    assert "Found 1 error in 1 file" in out, out
