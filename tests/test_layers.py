"""The layers you can see: import-linter's contracts from pyproject.toml hold, and break on a back-edge."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports(cwd: Path, package_parent: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    env = {"PYTHONPATH": str(package_parent), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", code, "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_layers_and_no_import_circle_hold() -> None:
    r = _lint_imports(ROOT, ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout


def test_a_back_edge_breaks_the_contract(tmp_path: Path) -> None:
    """A copy of the package with one import from core up to the CLI: the layers contract must fail."""
    shutil.copytree(ROOT / "vitdeploy", tmp_path / "vitdeploy", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    errors = tmp_path / "vitdeploy" / "core" / "errors.py"
    errors.write_text(errors.read_text() + "\nfrom vitdeploy.checks.metrics import logit_limit  # noqa: E402,F401\n")
    r = _lint_imports(tmp_path, tmp_path)
    assert r.returncode != 0
    assert "vitdeploy.core.errors -> vitdeploy.checks.metrics" in r.stdout, r.stdout


def test_a_circle_inside_a_layer_breaks_the_contract(tmp_path: Path) -> None:
    """stages.export importing stages.bundle while bundle imports export: the acyclic contract must fail."""
    shutil.copytree(ROOT / "vitdeploy", tmp_path / "vitdeploy", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    export = tmp_path / "vitdeploy" / "stages" / "export.py"
    export.write_text(export.read_text() + "\nfrom vitdeploy.stages import bundle  # noqa: E402,F401\n")
    r = _lint_imports(tmp_path, tmp_path)
    assert r.returncode != 0
    assert "no import circle between the modules of a package BROKEN" in r.stdout, r.stdout
