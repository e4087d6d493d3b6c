"""A bad option value or input is refused before torch is imported, where the check needs no torch (DESIGN: heavy
imports where they are used): one line, the documented exit code, in a third of a second instead of 1.5 s.

The checks are the library's own (``model.train_options.check_options``, ``model.presets.get_preset``,
``stages.export.check_opset``, ``model.sources.check_source``, ``core.fileio.check_output``), made before the modules
that need torch are imported.
"""

from __future__ import annotations

from pathlib import Path

from cli_cases import run_cli_cases

# (argv, exit code, the message's start): all run in one fresh process, which must not have imported torch after them
REFUSED = [
    (["train", "--epochs", "-1", "-o", "t.pth"], 2, "error: --epochs must be at least 1, not -1"),
    (["train", "--batch-size", "-8", "-o", "t.pth"], 2, "error: --batch-size must be at least 1, not -8"),
    (["train", "--lr", "-1", "-o", "t.pth"], 2, "error: --lr must be at least 0.0, not -1"),
    (["train", "--val-fraction", "1.0", "-o", "t.pth"], 2, "error: --val-fraction must be between 0 and 1"),
    (["train", "--label-smoothing", "2", "-o", "t.pth"], 2, "error: --label-smoothing must be at most 1.0, not 2"),
    (["train", "--image-size", "0", "-o", "t.pth"], 2, "error: --image-size must be at least 1, not 0"),
    (["train", "-o", "t.onnx", "--epochs", "1"], 2, "error: -o t.onnx: a checkpoint is a .pth file, not .onnx"),
    (["train", "--init", "ckpt.pth", "-o", "ckpt.pth"], 2, "error: -o ckpt.pth is the input ckpt.pth"),
    (["train", "--preset", "vit-gigantic", "-o", "t.pth"], 2, "error: unknown preset 'vit-gigantic': choose one of vit-digits,"),
    (["benchmark", "--preset", "vit-gigantic"], 2, "error: unknown preset 'vit-gigantic': choose one of vit-digits,"),
    (["import", "ckpt.pth", "-o", "ckpt.pth"], 2, "error: -o ckpt.pth is the input ckpt.pth"),
    (["import", "hf", "-o", "hf/model.safetensors"], 2, "error: -o hf/model.safetensors is a file of the input folder hf"),
    (["export", "img", "--opset", "5"], 2, "error: --opset must be at least 17, not 5"),
    (["export", "bad/legacy.pth"], 1, "error: bad/legacy.pth: a legacy torch.save file: re-save it with torch>=1.6's"),
    (["export", "img"], 1, "error: img is a folder without config.json: pass a vitdeploy checkpoint file, a Hugging"),
]

def test_refusals_that_need_no_torch_do_not_import_it(tmp_path: Path) -> None:
    (tmp_path / "ckpt.pth").write_bytes(b"a checkpoint (never read: the output check refuses first)")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "vit"}')
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"the folder's own weights")
    (tmp_path / "img").mkdir()
    (tmp_path / "bad").mkdir()
    import torch  # here, in the test's process: the legacy pickle is torch's own

    torch.save({"w": torch.zeros(2)}, tmp_path / "bad" / "legacy.pth", _use_new_zipfile_serialization=False)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    rows = run_cli_cases([argv for argv, _, _ in REFUSED], tmp_path, timeout=120)
    for (argv, code, says), r in zip(REFUSED, rows, strict=True):
        assert (r.code, len(r.lines())) == (code, 1) and r.lines()[0].startswith(says), (argv, r.code, r.stderr)
        assert not r.loaded("torch"), f"vitdeploy {' '.join(argv)}: torch imported before the refusal"
        assert r.changed == [], (argv, r.changed)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
