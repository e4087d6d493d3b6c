"""mypy over the whole package with the project's configuration ([tool.mypy] in pyproject.toml): 0 errors.

tests/test_engine_mypy.py adds the TensorRT modules against the tensorrt stubs; this one covers everything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_package_has_no_type_errors() -> None:
    res = _mypy("vitdeploy")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Success: no issues found" in res.stdout


def test_mypy_reports_an_error_in_a_package_module(tmp_path: Path) -> None:
    """The same invocation fails on a wrong call into the package (the check is in force, imports resolve)."""
    bad = tmp_path / "bad.py"
    bad.write_text("from vitdeploy.checks.metrics import logit_limit\n\nlogit_limit('1e-4', 3.0)\n")
    res = _mypy(str(bad))
    assert res.returncode == 1 and 'incompatible type "str"' in res.stdout, res.stdout + res.stderr
