"""The INT8 tests on a second kernel path: oneDNN's ISA lowered below VNNI (issue 37).

An ISA can be lowered, never raised. oneDNN, inside OpenVINO's CPU plugin, reads ``ONEDNN_MAX_CPU_ISA`` once per
process (oneDNN's doc/performance_considerations/dispatcher_control.md): set to ``AVX2`` (or ``AVX512_CORE``) on a
VNNI CPU, OpenVINO runs the int8 kernels of an AVX2-only CPU, saturation included, and vitdeploy's ``auto`` and
run.py count the CPU as one without VNNI (``core/host.py`` ``cpu_int8_dot_exact``). So a VNNI machine checks both
paths: the suite runs the VNNI path, and the test below runs the OpenVINO INT8 tests again in a child pytest under
``ONEDNN_MAX_CPU_ISA=AVX2``, where they take their no-VNNI branches for real. An AVX2-only machine cannot raise its
ISA: it runs the AVX2 path only (docs/cpu-backends.md, "What each CPU can check"). ONNX Runtime's MLAS has no such
switch (it reads CPUID alone), so its INT8 numbers are the host CPU's wherever the test runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vitdeploy.core.host import ONEDNN_ISAS_WITHOUT_INT8_DOT, cpu_int8_dot_exact, onednn_isa_without_int8_dot

pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'vitdeploy[cpu]')")

REPO = Path(__file__).resolve().parents[1]
VNNI_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_vnni amx_int8\n"
# The existing tests whose branches and figures follow the CPU's INT8 kernels on OpenVINO, run again under the lowered
# ISA: OpenVINO against ONNX Runtime on the CPU graph, the first-layer saturation the overflow fix answers (measured
# here, not assumed), auto's choice, the oracle against the independent runtime, and our INT8 against NNCF's.
LOWERED_TESTS = (
    "tests/test_lowered_isa.py::test_openvino_runs_the_int8_kernels_of_the_isa_it_is_given",
    "tests/test_openvino.py::test_int8_logits_follow_onnxruntime",
    "tests/test_openvino.py::test_no_vnni_saturation_and_the_overflow_fix",
    "tests/test_openvino.py::test_auto_picks_openvino_for_onnx_on_a_cpu",
    "tests/test_oracle.py::test_the_oracle_agrees_with_openvino_int8_on_our_artifacts",
    "tests/test_cpu_int8.py::test_our_cpu_int8_of_the_digits_vit_is_as_accurate_on_openvino_as_nncfs_own",
)


@pytest.mark.parametrize("isa", ["AVX2", "avx512_core", "SSE41"])
def test_an_isa_below_vnni_counts_as_a_cpu_without_vnni(isa: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """vitdeploy's host check and run.py's copy of it agree: a VNNI CPU under a lowered oneDNN ISA is one without
    VNNI for OpenVINO (auto then keeps INT8 off it), and a ceiling that keeps VNNI changes nothing."""
    from helpers import load_run_py

    run_py = load_run_py(REPO / "vitdeploy" / "stages" / "bundle_files" / "run.py")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(VNNI_CPUINFO)
    cpu8 = {"target": "cpu", "precision": "int8"}
    for var in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
        assert cpu_int8_dot_exact(str(cpuinfo)) and run_py.cpu_int8_dot_exact(str(cpuinfo))
        assert run_py.openvino_for(cpu8, "auto", str(cpuinfo)) == "auto"
        monkeypatch.setenv(var, isa)
        assert not cpu_int8_dot_exact(str(cpuinfo)) and not run_py.cpu_int8_dot_exact(str(cpuinfo)), var
        assert run_py.openvino_for(cpu8, "auto", str(cpuinfo)) == "no"
        for keeps in ("AVX512_CORE_VNNI", "AVX2_VNNI", "AVX512_CORE_AMX", "DEFAULT"):
            monkeypatch.setenv(var, keeps)
            assert cpu_int8_dot_exact(str(cpuinfo)) and run_py.cpu_int8_dot_exact(str(cpuinfo)), (var, keeps)
    assert run_py.ONEDNN_ISAS_WITHOUT_INT8_DOT == ONEDNN_ISAS_WITHOUT_INT8_DOT  # run.py runs without vitdeploy: a copy


def test_openvino_runs_the_int8_kernels_of_the_isa_it_is_given(digits_int8: Path) -> None:
    """The kernels OpenVINO compiled for the INT8 model (its runtime model's primitiveType): under a ceiling below
    VNNI none is a VNNI or AMX kernel and the int8 GEMMs run on AVX2's; natively on a VNNI CPU they are VNNI's or
    AMX's. Measured on this AMX CPU: natively brgemm_avx512_amx_i8; under AVX512_CORE_VNNI brgemm_avx512_i8; under
    AVX2 jit_gemm_i8 and jit_avx2_I8 (a few of OpenVINO's own float kernels stay jit_avx512_f32: the ceiling binds
    oneDNN's primitives, which hold every int8 GEMM)."""
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(digits_int8)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    kinds = sorted({str(op.get_rt_info()["primitiveType"].astype(str)) for op in compiled.get_runtime_model().get_ops()})
    int8 = [k for k in kinds if k.lower().endswith("_i8")]
    print(f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}: int8 kernels {int8}")
    assert int8, kinds
    if onednn_isa_without_int8_dot():
        assert not [k for k in kinds if "vnni" in k or "amx" in k or "avx512" in k and k.lower().endswith("i8")], kinds
    elif cpu_int8_dot_exact():
        assert [k for k in int8 if "avx512" in k or "amx" in k or "vnni" in k], kinds


@pytest.mark.slow  # a second pytest, rebuilding its artifacts: 385 s on 2 cores at load 10, most of it fixture setup
def test_the_openvino_int8_tests_hold_under_a_lowered_isa(tmp_path: Path) -> None:
    """LOWERED_TESTS, in a child pytest with ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN reads it once per process, so not in
    this one): on a VNNI CPU they run the AVX2 kernel path and take their no-VNNI branches. On a CPU without VNNI that
    is the path the suite has just run natively: nothing to add."""
    if not cpu_int8_dot_exact():
        pytest.skip("no VNNI on this CPU (or the ISA is already lowered): the suite ran the AVX2 path natively")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-rs",
                        f"--basetemp={tmp_path / 'child'}", *LOWERED_TESTS], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=900)
    tail = (r.stdout + r.stderr)[-6000:]
    print(tail)
    assert r.returncode == 0, tail
    assert " passed" in r.stdout and "failed" not in r.stdout, tail
