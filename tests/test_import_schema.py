"""Every field an import reads from a foreign file is checked when read (issue 37, P1/P2/P11): a hostile or broken
config.json, preprocessor_config.json or timm ``model_args``/``pretrained_cfg`` is one line naming the file, the
field and its value, raised as ``BadField`` before it can fail later as ZeroDivisionError, NaN logits or an
allocator error. One real folder of each kind is saved once by transformers and timm; each case edits a copy.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from vitdeploy.core.errors import BadField, UsageError, VitdeployError
from vitdeploy.model.importers import import_checkpoint, load_any

Edit = Callable[[dict[str, Any]], Any]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny ViTForImageClassification with its processor, a DINOv2 with 2 registers, and a timm save_for_hf
    folder: the three shapes of foreign folder the importer reads."""
    import timm
    import transformers as T
    from timm.models._hub import save_for_hf

    root = tmp_path_factory.mktemp("schema")
    torch.manual_seed(0)
    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
             "image_size": 32, "patch_size": 8}
    hf = root / "hf"
    cfg = T.ViTConfig(**small, id2label={0: "cat", 1: "dog", 2: "eel"}, label2id={"cat": 0, "dog": 1, "eel": 2})
    T.ViTForImageClassification(cfg).save_pretrained(hf)
    T.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(hf)
    reg = root / "dinov2_reg"
    T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(**small, num_register_tokens=2)).save_pretrained(reg)
    tm = root / "timm"
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, img_size=32, patch_size=8,
                              embed_dim=32, depth=1, num_heads=2)
    save_for_hf(model, str(tm), model_config={"label_names": ["a", "b", "c"]},
                model_args={"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2},
                safe_serialization=True)
    c = json.loads((tm / "config.json").read_text())
    c["pretrained_cfg"]["input_size"] = [3, 32, 32]
    (tm / "config.json").write_text(json.dumps(c))
    for d in (hf, reg, tm):
        load_any(d)  # each imports as saved: the cases below differ by their one edit
    return {"hf": hf, "reg": reg, "timm": tm}


def _edited(src: Path, dest: Path, file: str, edit: Edit) -> Path:
    shutil.copytree(src, dest)
    f = dest / file
    cfg = json.loads(f.read_text())
    out = edit(cfg)
    f.write_text(out if isinstance(out, str) else json.dumps(cfg if out is None else out))
    return dest


def _set(path: str, value: Any) -> Edit:
    """An edit setting a dotted field (``pretrained_cfg.crop_pct``) to ``value``."""
    def edit(cfg: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            cfg = cfg.setdefault(p, {})
        cfg[last] = value
    return edit


def _deep(cfg: dict[str, Any]) -> str:
    return '{"a": ' * 5000 + "1" + "}" * 5000


CFG, PRE = "config.json", "preprocessor_config.json"
# (folder, file, edit, the field the one line must name)
CASES: dict[str, tuple[str, str, Edit, str]] = {
    "hf-heads-0": ("hf", CFG, _set("num_attention_heads", 0), "num_attention_heads 0"),
    "hf-heads-negative": ("hf", CFG, _set("num_attention_heads", -2), "num_attention_heads -2"),
    "hf-channels-string": ("hf", CFG, _set("num_channels", "three"), 'num_channels "three"'),
    "hf-image-size-string": ("hf", CFG, _set("image_size", "big"), 'image_size "big"'),
    "hf-image-size-0": ("hf", CFG, _set("image_size", 0), "image_size 0"),
    "hf-image-size-null": ("hf", CFG, _set("image_size", None), "image_size null"),
    "hf-image-size-negative": ("hf", CFG, _set("image_size", -32), "image_size -32"),
    "hf-image-size-huge": ("hf", CFG, _set("image_size", 10**6), "image_size 1000000"),
    "hf-image-size-list-of-3": ("hf", CFG, _set("image_size", [32, 32, 32]), "image_size [32, 32, 32]"),
    "hf-ln-eps-nan": ("hf", CFG, lambda c: json.dumps({**c, "layer_norm_eps": math.nan}), "layer_norm_eps NaN"),
    "hf-ln-eps-negative": ("hf", CFG, _set("layer_norm_eps", -1e-6), "layer_norm_eps -1e-06"),
    "hf-hidden-size-inf": ("hf", CFG, lambda c: json.dumps({**c, "hidden_size": math.inf}), "hidden_size Infinity"),
    "hf-config-a-list": ("hf", CFG, lambda c: "[1, 2, 3]", "must be a JSON object"),
    "hf-config-deep": ("hf", CFG, _deep, "nested deeper than"),
    "hf-id2label-gap": ("hf", CFG, _set("id2label", {"0": "cat", "1": "dog", "5": "eel"}), "id2label"),
    "hf-id2label-not-int": ("hf", CFG, _set("id2label", {"0": "cat", "1": "dog", "x": "eel"}), "id2label"),
    "hf-id2label-list-of-dicts": ("hf", CFG, _set("id2label", [{"0": "cat"}, {"1": "dog"}, {"2": "eel"}]), "id2label"),
    "hf-registers-not-the-weights": ("reg", CFG, _set("num_register_tokens", 1000000), "num_register_tokens 1000000"),
    "pre-size-height-0": ("hf", PRE, _set("size", {"height": 0, "width": 32}), "size.height 0"),
    "pre-size-string": ("hf", PRE, _set("size", {"height": "32", "width": 32}), 'size.height "32"'),
    "pre-shortest-edge-0": ("hf", PRE, lambda c: {**c, "size": {"shortest_edge": 0}, "do_center_crop": True,
                                                  "crop_size": {"height": 32, "width": 32}}, "size.shortest_edge 0"),
    "pre-crop-size-0": ("hf", PRE, lambda c: {**c, "size": {"shortest_edge": 32}, "do_center_crop": True,
                                              "crop_size": {"height": 0, "width": 0}}, "crop_size.height 0"),
    "pre-crop-far-too-small": ("hf", PRE, lambda c: {**c, "size": {"shortest_edge": 4000}, "do_center_crop": True,
                                                     "crop_size": {"height": 32, "width": 32}}, "crop_size"),
    "pre-mean-of-2": ("hf", PRE, _set("image_mean", [0.5, 0.5]), "image_mean [0.5, 0.5]"),
    "pre-std-of-4": ("hf", PRE, _set("image_std", [0.5, 0.5, 0.5, 0.5]), "image_std [0.5, 0.5, 0.5, 0.5]"),
    "pre-rescale-0": ("hf", PRE, _set("rescale_factor", 0), "rescale_factor 0"),
    "pre-rescale-nan": ("hf", PRE, lambda c: json.dumps({**c, "rescale_factor": math.nan}), "rescale_factor NaN"),
    "timm-heads-0": ("timm", CFG, _set("model_args.num_heads", 0), "model_args.num_heads 0"),
    "timm-patch-0": ("timm", CFG, _set("model_args.patch_size", 0), "model_args.patch_size 0"),
    "timm-img-size-list": ("timm", CFG, _set("model_args.img_size", [32]), "model_args.img_size [32]"),
    "timm-input-size-x": ("timm", CFG, _set("pretrained_cfg.input_size", "x"), 'pretrained_cfg.input_size "x"'),
    "timm-input-size-of-2": ("timm", CFG, _set("pretrained_cfg.input_size", [32, 32]), "pretrained_cfg.input_size [32, 32]"),
    "timm-crop-pct-1e-4": ("timm", CFG, _set("pretrained_cfg.crop_pct", 1e-4), "pretrained_cfg.crop_pct 0.0001"),
    "timm-crop-pct-0.002": ("timm", CFG, _set("pretrained_cfg.crop_pct", 0.002), "pretrained_cfg.crop_pct 0.002"),
    "timm-crop-pct-1000": ("timm", CFG, _set("pretrained_cfg.crop_pct", 1000), "pretrained_cfg.crop_pct 1000"),
    "timm-label-names-string": ("timm", CFG, _set("label_names", "abc"), 'label_names "abc"'),
    "timm-label-names-count": ("timm", CFG, _set("label_names", ["a", "b"]), "label_names has 2 names"),
    "timm-ln-eps-nan": ("timm", CFG, lambda c: json.dumps({**c, "model_args": {
        **c["model_args"], "norm_layer": {"name": "LayerNorm", "eps": math.nan}}}), "model_args.norm_layer.eps NaN"),
    "eva-rope-temperature-nan": ("timm", CFG, lambda c: json.dumps({
        **c, "architecture": "vit_base_patch16_rope_224",
        "model_args": {**c["model_args"], "rope_temperature": math.nan}}), "model_args.rope_temperature NaN"),
    "eva-heads-0": ("timm", CFG, lambda c: {**c, "architecture": "vit_base_patch16_rope_224",
                                            "model_args": {**c["model_args"], "num_heads": 0}}, "model_args.num_heads 0"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_config_field_is_one_line_naming_file_field_and_value(case: str, folders: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    """Each edit is refused at import by BadField: the file's path, the field with its value, nothing else."""
    kind, file, edit, field = CASES[case]
    d = _edited(folders[kind], tmp_path / kind, file, edit)
    with pytest.raises(VitdeployError) as e:
        load_any(d)
    msg = str(e.value)
    assert isinstance(e.value, BadField), msg
    assert msg.startswith(str(d / file)) and field in msg and "\n" not in msg, msg
    assert "--arch" not in msg, msg  # the user gave a folder, not the option


def test_a_folder_naming_an_unknown_timm_architecture_names_the_file_not_an_option(folders: dict[str, Path],
                                                                                    tmp_path: Path) -> None:
    """P11: the name comes from config.json's ``architecture``, so the message says that field, never ``--arch``."""
    d = _edited(folders["timm"], tmp_path / "t", CFG, _set("architecture", "vit_tinyy_patch16_224"))
    with pytest.raises(BadField, match=r"config\.json: architecture 'vit_tinyy_patch16_224': not a timm ViT") as e:
        load_any(d)
    assert "--arch" not in str(e.value)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.float8_e4m3fn, torch.complex64])
def test_weights_of_a_dtype_no_vit_has_are_refused_not_cast(dtype: torch.dtype, folders: dict[str, Path],
                                                            tmp_path: Path) -> None:
    """bool/int8/fp8/complex weights were cast to float32 silently (complex with a torch warning): refused, naming
    the tensor; fp16 and bf16 are legal and import."""
    from safetensors.torch import load_file, save_file

    d = tmp_path / "w"
    shutil.copytree(folders["hf"], d)
    sd = load_file(d / "model.safetensors")
    key = next(k for k in sd if k.endswith("query.weight"))
    sd[key] = sd[key].to(dtype) if dtype != torch.complex64 else torch.complex(sd[key], sd[key])
    save_file(sd, d / "model.safetensors")
    with pytest.raises(VitdeployError, match=rf"{key} is {str(dtype).removeprefix('torch.')}, which no ViT weight is"):
        load_any(d)
    for legal in (torch.float16, torch.bfloat16):
        save_file({k: v.to(legal) if k == key else v for k, v in load_file(folders["hf"] / "model.safetensors").items()},
                  d / "model.safetensors")
        assert load_any(d).state_dict  # imports


def test_id2label_repeating_a_name_keeps_one_name_per_class(folders: dict[str, Path], tmp_path: Path) -> None:
    """ImageNet's id2label names "crane" twice (a bird, a machine): the later id gets its number, so infer's answers
    stay distinct, and the folder still imports."""
    d = _edited(folders["hf"], tmp_path / "dup", CFG, _set("id2label", {"0": "crane", "1": "dog", "2": "crane"}))
    assert load_any(d).manifest.labels == ["crane", "dog", "crane (2)"]
    # the conversion is said in one line, never silent (issue 37: "convert them explicitly, with the conversion said")
    from typer.testing import CliRunner

    from vitdeploy.cli import app

    r = CliRunner().invoke(app, ["import", str(d), "-o", str(tmp_path / "dup.pth")])
    assert r.exit_code == 0, r.output
    notes = [line for line in r.output.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {d / CFG}: id2label names 'crane' under ids 0 and 2: class 2 is named 'crane (2)'"], r.output


def test_unknown_arch_and_off_grid_image_size_are_refused_before_the_weights(folders: dict[str, Path],
                                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """P11: exit 2 came only after the weights were read. Now the name and the patch grid are checked first."""
    import vitdeploy.model.importers as imp

    def no_reading(*a: Any, **k: Any) -> Any:
        raise AssertionError("weights read before the refusal")

    monkeypatch.setattr(imp, "torch_load", no_reading)
    monkeypatch.setattr(imp, "_hf_state_dict", no_reading)
    monkeypatch.setattr(imp, "read_tensors", no_reading)
    pth = tmp_path / "w.pth"
    torch.save({"x": torch.zeros(1)}, pth)
    with pytest.raises(UsageError, match="--arch vit_nope_224: not a timm ViT name"):
        import_checkpoint(pth, tmp_path / "o.pth", arch="vit_nope_224")
    with pytest.raises(UsageError, match="--image-size 36x36: not a multiple of .* patch size 8"):
        import_checkpoint(folders["hf"], tmp_path / "o.pth", image_size=(36, 36))
    with pytest.raises(UsageError, match="--image-size 100x100: not a multiple of .* patch size 16"):
        import_checkpoint(pth, tmp_path / "o.pth", arch="vit_tiny_patch16_224", image_size=(100, 100))
    assert not (tmp_path / "o.pth").exists()


def test_beit_at_its_own_size_is_not_refused() -> None:
    """P11: ``--image-size`` equal to a BEiT's own size asks nothing of its relative position tables."""
    from vitdeploy.model.pos_embed import check_resize

    beit = {"patch_size": 16, "image_size": [224, 224], "rel_pos_bias": True}
    check_resize(beit, (224, 224), "beit")
    with pytest.raises(UsageError, match="relative position bias"):
        check_resize(beit, (256, 256), "beit")


def test_cli_import_of_hostile_folders_is_one_line_exit_1_nothing_written(folders: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    """The promise on the command line: one ``error:`` line, the documented exit code (1, as every refusal of a
    foreign model's files), no traceback, no output file: a deep config.json, a processor field, a timm field."""
    cases = ["hf-config-deep", "pre-rescale-nan", "timm-label-names-string"]
    for case in cases:
        kind, file, edit, field = CASES[case]
        d = _edited(folders[kind], tmp_path / case, file, edit)
        out = d.with_suffix(".pth")
        r = subprocess.run([sys.executable, "-m", "vitdeploy", "import", str(d), "-o", str(out)],
                           capture_output=True, text=True, timeout=120)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("importing")]
        assert r.returncode == 1, (case, r.stderr)
        assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in r.stderr, (case, r.stderr)
        assert field.split()[0] in lines[0] and r.stdout == "", (case, r.stdout, r.stderr)
        assert not out.exists(), case
