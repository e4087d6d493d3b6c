"""The lint steps beyond ruff, `mypy vitdeploy` and `lint-imports` (run by `make lint`, not by the test suite).

1. mypy over the TensorRT modules against the published tensorrt-stubs (10.13 API). The wheel as published cannot be
   used by mypy directly: its ``tensorrt/`` folder has no ``py.typed`` (so mypy skips it) and
   ``tensorrt_bindings/tensorrt.pyi`` has syntax errors (parameters named ``in``, a required parameter after
   defaults). The copy made here fixes exactly those two things; a deliberately wrong call (``Builder.build_engine``,
   which TensorRT 10 removed) proves the stubs are in force, and it must be the only error.
2. Proofs that the linters can fail: mypy with the project's configuration reports a wrong call into the package,
   and import-linter's two contracts break on a copy of the package with one import up a layer and one circle.

Exit status 0 when every step holds; each failure is printed. Skips (no tensorrt-stubs) are said, not hidden.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The modules that call TensorRT (bundle_files/run.py is a standalone script for 8.5-11, checked by the mock tests).
TRT_MODULES = sorted(
    {str(p.relative_to(ROOT)) for p in (ROOT / "vitdeploy").rglob("*.py")
     if "bundle_files" not in p.parts and re.search(r"^\s*import tensorrt", p.read_text(), re.M)}
    | {m for m in ("vitdeploy/stages/engine.py", "vitdeploy/cli/engine.py") if (ROOT / m).exists()}
)


def _stub_dirs() -> tuple[Path, Path] | None:
    spec = importlib.util.find_spec("tensorrt_stubs")
    if spec is None or not spec.submodule_search_locations:
        return None
    site = Path(list(spec.submodule_search_locations)[0]).parent
    trt, bindings = site / "tensorrt", site / "tensorrt_bindings"
    if not (trt / "__init__.pyi").exists() or not (bindings / "tensorrt.pyi").exists():
        return None
    return trt, bindings


def _fixed_stubs(dest: Path, dirs: tuple[Path, Path]) -> Path:
    for src in dirs:
        (dest / src.name).mkdir(parents=True)
        for f in src.glob("*.pyi"):
            s = f.read_text()
            s = re.sub(r"([(,]\s*)in: ", r"\1in_: ", s)  # `in` is a keyword: not a valid parameter name
            s = s.replace(", channel_axis: int)", ", channel_axis: int = ...)")
            (dest / src.name / f.name).write_text(s)
    return dest


def _run(args: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def tensorrt_stubs(tmp: Path) -> str | None:
    """mypy over TRT_MODULES against the fixed stubs: only the planted removed-API call may be an error."""
    dirs = _stub_dirs()
    if dirs is None:
        print("skip: tensorrt-stubs is not installed (pip install --no-deps tensorrt-stubs)")
        return None
    stubs = _fixed_stubs(tmp / "stubs", dirs)
    bad = tmp / "uses_removed_api.py"
    bad.write_text(
        "import tensorrt as trt\n\n\ndef f() -> None:\n"
        "    b = trt.Builder(trt.Logger(trt.Logger.WARNING))\n"
        "    b.build_engine(b.create_network(0), b.create_builder_config())\n"
    )
    cfg = tmp / "mypy.ini"
    cfg.write_text(
        "[mypy]\npython_version = 3.11\nignore_missing_imports = True\nfollow_imports = silent\n"
        f"mypy_path = {stubs}\ncache_dir = {ROOT / '.mypy_cache' / 'trt'}\n"
        "[mypy-tensorrt,tensorrt.*,tensorrt_bindings,tensorrt_bindings.*]\nignore_errors = True\n"
        "[mypy-torch,torch.*,transformers,transformers.*,onnxruntime,onnxruntime.*]\nfollow_imports = skip\n"
    )
    r = _run([sys.executable, "-m", "mypy", "--config-file", str(cfg), *TRT_MODULES, str(bad)])
    out = r.stdout + r.stderr
    if '"Builder" has no attribute "build_engine"' not in out:
        return "tensorrt-stubs are not in force (the removed Builder.build_engine was not caught):\n" + out
    if "Found 1 error in 1 file" not in out:
        return "a TensorRT call in " + ", ".join(TRT_MODULES) + " does not match tensorrt-stubs:\n" + out
    print(f"ok: {len(TRT_MODULES)} TensorRT modules type-check against tensorrt-stubs")
    return None


def mypy_can_fail(tmp: Path) -> str | None:
    """The project's mypy invocation fails on a wrong call into the package (the check is in force)."""
    bad = tmp / "bad.py"
    bad.write_text("from vitdeploy.checks.metrics import logit_limit\n\nlogit_limit('1e-4', 3.0)\n")
    r = _run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(bad)])
    if r.returncode != 1 or 'incompatible type "str"' not in r.stdout:
        return "mypy did not report a wrong call into the package:\n" + r.stdout + r.stderr
    print("ok: mypy reports a wrong call into the package")
    return None


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return _run([sys.executable, "-c", code, "--no-cache"], cwd=cwd, env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def import_contracts_can_fail(tmp: Path) -> str | None:
    """A copy of the package with one import up a layer, then one circle inside a layer: each contract breaks."""
    cases = [
        ("core/errors.py", "from vitdeploy.checks.metrics import logit_limit", "vitdeploy.core.errors -> vitdeploy.checks.metrics"),
        ("stages/export.py", "from vitdeploy.stages import bundle", "no import circle between the modules of a package BROKEN"),
    ]
    for i, (module, line, want) in enumerate(cases):
        work = tmp / f"imports{i}"
        shutil.copytree(ROOT / "vitdeploy", work / "vitdeploy", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
        f = work / "vitdeploy" / module
        f.write_text(f.read_text() + f"\n{line}  # noqa: E402,F401\n")
        r = _lint_imports(work)
        if r.returncode == 0 or want not in r.stdout:
            return f"import-linter did not break on `{line}` in {module}:\n" + r.stdout + r.stderr
    print("ok: import-linter breaks on an import up a layer and on a circle")
    return None


def main() -> int:
    failed = 0
    with tempfile.TemporaryDirectory() as d:
        for i, step in enumerate((tensorrt_stubs, mypy_can_fail, import_contracts_can_fail)):
            tmp = Path(d) / str(i)
            tmp.mkdir()
            problem = step(tmp)
            if problem:
                print(f"FAILED {step.__name__}: {problem}", file=sys.stderr)
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
