"""A bad option value is refused before torch is imported, where the check needs no torch (DESIGN: heavy imports
where they are used): one line, the documented exit code, in a third of a second instead of 1.5 s.

The CLI makes some of these checks ahead of the library, in the library's words: the tests below hold the two to the
same message, check for check.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# (argv, exit code, the message's start): each run in one process, which must not have imported torch after it
REFUSED = [
    (["train", "--epochs", "-1", "-o", "t.pth"], 2, "error: --epochs must be at least 1, not -1"),
    (["train", "--batch-size", "-8", "-o", "t.pth"], 2, "error: --batch-size must be at least 1, not -8"),
    (["train", "--lr", "-1", "-o", "t.pth"], 2, "error: --lr must be a positive number, not -1.0"),
    (["train", "--val-fraction", "1.0", "-o", "t.pth"], 2, "error: --val-fraction must be between 0 and 1"),
    (["train", "--label-smoothing", "2", "-o", "t.pth"], 2, "error: --label-smoothing must be in [0, 1), not 2.0"),
    (["train", "--image-size", "0", "-o", "t.pth"], 2, "error: --image-size must be at least 1, not 0"),
    (["train", "-o", "t.onnx", "--epochs", "1"], 2, "error: -o t.onnx: a checkpoint is a .pth file, not .onnx"),
    (["train", "--init", "ckpt.pth", "-o", "ckpt.pth"], 2, "error: -o ckpt.pth is the input ckpt.pth"),
    (["import", "ckpt.pth", "-o", "ckpt.pth"], 2, "error: -o ckpt.pth is the input ckpt.pth"),
    (["import", "hf", "-o", "hf/model.safetensors"], 2, "error: -o hf/model.safetensors is a file of the input folder hf"),
    (["export", "img"], 1, "error: img is a folder without config.json"),
    (["export", "img", "--opset", "5"], 2, "error: --opset 5 is below 17"),
]

RUN_ALL = """
import contextlib, io, json, sys
import vitdeploy.__main__ as m
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = m.main(argv)
    print(json.dumps([code, err.getvalue(), "torch" in sys.modules]))
"""


def test_refusals_that_need_no_torch_do_not_import_it(tmp_path: Path) -> None:
    (tmp_path / "ckpt.pth").write_bytes(b"a checkpoint (never read: the output check refuses first)")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "vit"}')
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"the folder's own weights")
    (tmp_path / "img").mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    r = subprocess.run([sys.executable, "-c", RUN_ALL, json.dumps([a for a, _, _ in REFUSED])], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == len(REFUSED), r.stdout
    for (argv, code, says), (got, err, torch_loaded) in zip(REFUSED, rows, strict=True):
        lines = err.strip().splitlines()
        assert (got, len(lines)) == (code, 1) and lines[0].startswith(says), (argv, got, err)
        assert not torch_loaded, f"vitdeploy {' '.join(argv)}: torch imported before the refusal"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


# --- the CLI's early checks say what the library's say ----------------------------------------------------------

TRAIN_DEFAULTS: dict[str, Any] = dict(
    epochs=None, batch_size=64, lr=2e-3, weight_decay=0.05, label_smoothing=0.1, val_fraction=0.1, image_size=None,
    patch_size=None, workers=None, accum_steps=1, precision=None, preset=None, out=Path("t.pth"), init=None)

BAD_TRAIN = [
    {"epochs": 0}, {"epochs": -1}, {"batch_size": 0}, {"lr": 0.0}, {"lr": float("nan")}, {"lr": float("inf")},
    {"weight_decay": -1.0}, {"weight_decay": float("nan")}, {"label_smoothing": 1.0}, {"label_smoothing": -0.1},
    {"val_fraction": 0.0}, {"val_fraction": 1.0}, {"image_size": 0}, {"patch_size": 0}, {"workers": -1},
    {"accum_steps": 0}, {"precision": "fp8"}, {"out": Path("t.onnx")}, {"out": Path("T.ENGINE")}, {"out": Path("t.json")},
    {"epochs": 0, "lr": -1.0, "out": Path("t.onnx")},  # several: the same one comes first
]


@pytest.mark.parametrize("bad", BAD_TRAIN, ids=lambda b: ",".join(f"{k}={v}" for k, v in b.items()))
def test_train_refuses_early_in_check_options_words(bad: dict[str, Any]) -> None:
    from vitdeploy.cli.train import refuse_early
    from vitdeploy.core.errors import UsageError
    from vitdeploy.model.train import TrainOptions, check_options

    opts = {**TRAIN_DEFAULTS, **bad}
    with pytest.raises(UsageError) as early:
        refuse_early(**opts)
    with pytest.raises(UsageError) as lib:
        check_options(TrainOptions(**opts))
    assert (str(early.value), early.value.exit_code) == (str(lib.value), lib.value.exit_code)


def test_train_early_check_takes_what_check_options_takes(tmp_path: Path) -> None:
    from vitdeploy.cli.train import refuse_early
    from vitdeploy.core.errors import UsageError
    from vitdeploy.model.train import TrainOptions, check_options

    ckpt = tmp_path / "ckpt.pth"
    ckpt.write_bytes(b"x")
    fine = [{}, {"precision": "bf16", "out": tmp_path / "a.pth"}, {"init": ckpt, "out": tmp_path / "b.pth"},
            {"image_size": 48, "patch_size": 8, "workers": 0, "epochs": 1, "label_smoothing": 0.0}]
    for ok in fine:
        refuse_early(**{**TRAIN_DEFAULTS, **ok})
        check_options(TrainOptions(**{**TRAIN_DEFAULTS, **ok}))
    # an unknown preset is check_options' to refuse (the presets live beside torch): the early check leaves -o too
    refuse_early(**{**TRAIN_DEFAULTS, "preset": "vit-gigantic", "out": Path("t.onnx")})
    with pytest.raises(UsageError, match="unknown preset"):
        check_options(TrainOptions(**{**TRAIN_DEFAULTS, "preset": "vit-gigantic", "out": Path("t.onnx")}))


def test_export_names_a_plain_folder_in_load_any_words(tmp_path: Path) -> None:
    from vitdeploy.cli.export import NOT_A_CHECKPOINT_FOLDER
    from vitdeploy.core.errors import VitdeployError
    from vitdeploy.model.importers import load_any

    with pytest.raises(VitdeployError) as e:
        load_any(tmp_path)
    assert str(e.value) == f"{tmp_path} {NOT_A_CHECKPOINT_FOLDER}" and e.value.exit_code == 1
