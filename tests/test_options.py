"""Every bad option value is one line and exit 2, before any work, through the `vitdeploy` entry point.

Before, these exited 1 in some commands and 2 in others, some printed Typer's framed block, some were accepted (and
one, --batch-sizes 100000, was killed for memory). The refusals run in one process through the console script's
function (``tests/cli_cases.py``); ``test_probe.py`` runs such refusals as processes of their own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_cases import CliCase, run_cli_cases

from vitdeploy.tools.bench import activation_bytes

VENV_BIN = Path(sys.executable).parent


def vitdeploy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "vitdeploy"), *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def work(digits_ckpt: Path, digits_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("options")
    (d / "ckpt.pth").write_bytes(digits_ckpt.read_bytes())
    (d / "model.onnx").write_bytes(digits_onnx.read_bytes())
    (d / "img").mkdir()
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 10, 10)).save(d / "img" / "a.png")
    return d


BAD = [
    ("infer", "img", "--workers", "-2"),
    ("infer", "img", "--threads", "-1"),
    ("infer", "img", "--batch-size", "0"),
    ("infer", "img", "--top-k", "0"),
    ("infer", "img", "--backend", "nosuch"),
    ("benchmark", "model.onnx", "--threads", "-2"),
    ("benchmark", "model.onnx", "--warmup", "-1"),
    ("benchmark", "model.onnx", "--iterations", "0"),
    ("benchmark", "model.onnx", "--batch-sizes", "0,8"),
    ("benchmark", "model.onnx", "--batch-sizes", "100000000"),
    ("benchmark", "model.onnx", "--backends", "nosuch"),
    ("verify", "model.onnx", "model.onnx", "--images", "img", "--tolerance", "-1"),
    ("verify", "model.onnx", "model.onnx", "--images", "img", "--batch-size", "0"),
    ("calibrate", "model.onnx", "--images", "img", "--max-drop", "-1"),
    ("calibrate", "model.onnx", "--images", "img", "--min-agreement", "2"),
    ("calibrate", "model.onnx", "--images", "img", "--num-images", "0"),
    ("calibrate", "model.onnx", "--images", "img", "--method", "nosuch"),
    ("calibrate", "model.onnx", "--images", "img", "--max-drop", "0.5"),  # a budget without --eval
    ("export", "ckpt.pth", "--opset", "5"),
    ("explain", "img/a.png", "--model", "model.onnx", "--top-k", "0"),
    ("explain", "img/a.png", "--model", "model.onnx", "--discard-ratio", "1"),
    ("bundle", "model.onnx", "--references", "0"),
    ("bundle", "model.onnx", "--max-batch", "0"),
    ("build-engine", "model.onnx", "--min-batch", "0"),
    ("build-engine", "model.onnx", "--workspace", "0"),
    ("build-engine", "model.onnx", "--dla-core", "-1"),
    ("nosuch-command",),
    ("infer",),  # a missing argument
]


@pytest.fixture(scope="module")
def refusals(work: Path) -> dict[tuple[str, ...], CliCase]:
    """Every BAD case run in ``work``, in one process."""
    return {tuple(c.argv): c for c in run_cli_cases(BAD, work)}


@pytest.mark.parametrize("args", BAD, ids=lambda a: " ".join(a))
def test_bad_option_values_exit_2_in_one_line_before_any_work(refusals: dict[tuple[str, ...], CliCase],
                                                              args: tuple[str, ...]) -> None:
    r = refusals[args]
    assert r.code == 2, (r.code, r.stderr)
    assert len(r.lines()) == 1 and r.lines()[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr and "╭" not in r.stderr
    assert r.seconds < 60  # refused before the work, not after it
    assert r.changed == []  # nothing written


def test_a_batch_too_big_for_memory_names_the_batch_that_fits(work: Path) -> None:
    r = vitdeploy("benchmark", "model.onnx", "--batch-sizes", "100000000", cwd=work)
    assert "GiB" in r.stderr and "use a batch of at most" in r.stderr, r.stderr


def test_activation_estimate_grows_with_tokens_and_batch() -> None:
    small = {"patch_size": 16, "embed_dim": 384, "num_heads": 6, "mlp_dim": 1536}
    a224, a384 = activation_bytes(small, (224, 224)), activation_bytes(small, (384, 384))
    # vit-small at 224: 197 tokens; scores 2·6·197², MLP 2·197·1536, Q/K/V/residual 4·197·384, input 3·224²: ~5.7 MB
    assert a224 == 4 * (2 * 6 * 197 * 197 + 2 * 197 * 1536 + 4 * 197 * 384 + 3 * 224 * 224)
    assert a384 > 2.5 * a224  # 577 tokens: the N² term dominates


def test_help_and_version_still_exit_0(work: Path) -> None:
    for args in (("--help",), ("infer", "--help"), ("--version",)):
        r = vitdeploy(*args, cwd=work)
        assert r.returncode == 0 and r.stdout.strip(), (args, r.stderr)


def test_explain_compare_refuses_a_model_of_other_classes(work: Path, digits_ckpt: Path) -> None:
    """Issue 15, item 13: before, explain --compare reported an "agreement" between unrelated labels."""
    from vitdeploy.stages.export import export_onnx

    names = work / "names.txt"
    names.write_text("".join(f"digit {i}\n" for i in range(10)))
    other = work / "other.onnx"
    export_onnx(digits_ckpt, other, check=False, labels=names)
    try:
        r = vitdeploy("explain", "img/a.png", "--model", "model.onnx", "--compare", "other.onnx", "-o", "maps", cwd=work)
        assert r.returncode == 2 and "names class 0 'digit 0'" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and not (work / "maps").exists()
    finally:
        other.unlink()
        names.unlink()
