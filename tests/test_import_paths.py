"""A foreign model folder is read as untrusted input (issue 37, P3-P6): its sharded index names files inside it
only; import reads and hashes the files the model is made of and nothing else beside them; sizes read from files
and options have ceilings before anything is allocated; the output never lands where the folder's loader reads.

The folders are real: transformers ``save_pretrained`` with ``max_shard_size`` writes the shards and their index,
then one entry or one file is changed the way a hostile or broken folder would have it.
"""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from pathlib import Path

import pytest
import torch
from cli_cases import run_cli_cases

from vitdeploy.core.errors import UsageError, VitdeployError

INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ViTForImageClassification saved by transformers in four safetensors shards with their index."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
                    patch_size=16, num_labels=3)
    d = tmp_path_factory.mktemp("saved") / "sharded"
    ViTForImageClassification(cfg).save_pretrained(d, max_shard_size="30KB")
    assert len(list(d.glob("model-*.safetensors"))) > 1
    return d


@pytest.fixture
def hf(saved: Path, tmp_path: Path) -> Path:
    d = tmp_path / "hf"
    shutil.copytree(saved, d)
    return d


def _set_index(folder: Path, change: object, name: str = INDEX) -> None:
    """Rewrite the index: ``change`` as the whole weight_map, or a function of the index's dict."""
    idx = json.loads((folder / name).read_text())
    if callable(change):
        change(idx)
    else:
        idx["weight_map"] = change
    (folder / name).write_text(json.dumps(idx))


def _first_shard_to(folder: Path, entry: str) -> str:
    """Point every tensor of the first shard at ``entry``; the shard's old name."""
    idx = json.loads((folder / INDEX).read_text())
    first = sorted(set(idx["weight_map"].values()))[0]
    idx["weight_map"] = {k: (entry if v == first else v) for k, v in idx["weight_map"].items()}
    (folder / INDEX).write_text(json.dumps(idx))
    return first


def _load(folder: Path) -> object:
    from vitdeploy.model.importers import load_any

    return load_any(folder)


# --- P3: a sharded index names files inside its folder, regular and bounded ---------------------------------------


def test_a_sharded_folder_imports_and_records_its_parts(hf: Path, tmp_path: Path) -> None:
    """The index and every shard are the source's files: recorded, so lineage later hashes exactly these."""
    from vitdeploy.model.importers import import_checkpoint

    _, m = import_checkpoint(hf, tmp_path / "ckpt.pth")
    shards = sorted(p.name for p in hf.glob("model-*.safetensors"))
    assert m.source["files"] == sorted(["config.json", INDEX, *shards])


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_an_index_entry_leading_out_of_the_folder_is_refused_naming_the_index_and_entry(hf: Path, where: str) -> None:
    """``../x``, ``/abs/x`` and a symlink out of the folder were imported from there (and info called the source
    current after that file changed)."""
    outside = hf.parent / "outside.safetensors"
    first = sorted(hf.glob("model-*.safetensors"))[0]
    shutil.copy(first, outside)
    entry = {"parent": "../outside.safetensors", "absolute": str(outside), "symlink": "link.safetensors"}[where]
    if where == "symlink":
        (hf / "link.safetensors").symlink_to(outside)
    _first_shard_to(hf, entry)
    with pytest.raises(VitdeployError) as e:
        _load(hf)
    msg = str(e.value)
    assert str(hf / INDEX) in msg and "weight_map" in msg and repr(entry) in msg and "\n" not in msg, msg


def test_an_index_entry_that_is_a_fifo_is_refused_without_reading_it(hf: Path) -> None:
    os.mkfifo(hf / "pipe.safetensors")
    _first_shard_to(hf, "pipe.safetensors")
    with pytest.raises(VitdeployError, match=r"'pipe\.safetensors': not a regular file"):
        _load(hf)


def test_a_missing_shard_is_named_with_its_index(hf: Path) -> None:
    shard = sorted(hf.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(VitdeployError, match=rf"index\.json: weight_map names '{shard.name}', which is missing from"):
        _load(hf)


def test_an_index_that_is_a_symlink_out_of_the_folder_is_refused(hf: Path) -> None:
    real = hf.parent / "elsewhere.json"
    (hf / INDEX).rename(real)
    (hf / INDEX).symlink_to(real)
    with pytest.raises(VitdeployError, match="leads out of"):
        _load(hf)


@pytest.mark.parametrize(("weight_map", "says"), [
    (["model-00001-of-00004.safetensors"], "weight_map is ['model-00001-of-00004.safetensors'], not an object"),
    ({"vit.embeddings.cls_token": 1}, "weight_map['vit.embeddings.cls_token'] is 1, not a shard file name"),
    ({}, "weight_map is {}, not an object"),
    ("model.safetensors", "weight_map is 'model.safetensors', not an object"),
])
def test_a_weight_map_of_the_wrong_type_names_the_file_and_field(hf: Path, weight_map: object, says: str) -> None:
    """A list raised AttributeError, integer values TypeError: each is one line naming the index and the field."""
    _set_index(hf, weight_map)
    with pytest.raises(VitdeployError) as e:
        _load(hf)
    assert str(e.value).startswith(f"{hf / INDEX}: {says}"), str(e.value)


def test_an_index_that_is_a_json_list_names_the_file(hf: Path) -> None:
    (hf / INDEX).write_text("[1, 2]")
    with pytest.raises(VitdeployError, match=r"index\.json: a JSON list, not an object with a weight_map"):
        _load(hf)


def test_a_torch_bin_index_is_held_to_the_same_rule(hf: Path) -> None:
    """pytorch_model.bin.index.json (transformers 4's sharded torch format), written here shard by shard."""
    from safetensors.torch import load_file

    idx = json.loads((hf / INDEX).read_text())
    wm = {}
    for i, shard in enumerate(sorted(set(idx["weight_map"].values()))):
        name = f"pytorch_model-{i:05d}.bin"
        torch.save(load_file(hf / shard), hf / name)
        (hf / shard).unlink()
        wm.update({k: name for k, v in idx["weight_map"].items() if v == shard})
    (hf / INDEX).unlink()
    (hf / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    assert _load(hf) is not None  # it imports as it is
    _set_index(hf, {**wm, "vit.embeddings.cls_token": "../x.bin"}, "pytorch_model.bin.index.json")
    with pytest.raises(VitdeployError, match=r"pytorch_model\.bin\.index\.json: weight_map names '\.\./x\.bin'"):
        _load(hf)


def test_a_hub_cache_snapshot_whose_files_link_to_its_blobs_imports(hf: Path, tmp_path: Path) -> None:
    """The Hugging Face cache keeps files in ``blobs/`` and links them from ``snapshots/REV/``: still inside the
    model's cache folder, so allowed (a link out of that folder is not)."""
    repo = tmp_path / "models--org--vit"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for f in hf.iterdir():
        shutil.move(f, repo / "blobs" / f.name)
        (snap / f.name).symlink_to(Path("../../blobs") / f.name)
    assert _load(snap) is not None


# --- P4: import reads and hashes the model's files only ----------------------------------------------------------


def test_a_huge_file_beside_the_weights_is_neither_read_nor_hashed(hf: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A 60 GB sparse file (and a link to it) beside the weights made import read 60 GB (64-111 s): only the model's
    files are hashed, at import and by lineage's ``(current)`` check, and a change to the stranger changes nothing."""
    import vitdeploy.core.fileio as fileio
    from vitdeploy.core.lineage import CURRENT, STALE, _sha_cache, source_link
    from vitdeploy.model.checkpoint import load_checkpoint
    from vitdeploy.model.importers import import_checkpoint

    big = hf / "download.partial"
    with open(big, "wb") as f:
        f.truncate(60 << 30)
    (hf / "also.bin").symlink_to(big)
    hashed: list[str] = []
    real = fileio.sha256_file

    def recording(path: str | Path, chunk: int = 1 << 20) -> str:
        hashed.append(Path(path).name)
        if Path(path).name in ("download.partial", "also.bin"):
            raise AssertionError(f"hashed {path}")
        return real(path, chunk)

    monkeypatch.setattr(fileio, "sha256_file", recording)
    out = tmp_path / "work" / "ckpt.pth"
    out.parent.mkdir()
    _, m = import_checkpoint(hf, out)
    assert "download.partial" not in m.source["files"] and "also.bin" not in m.source["files"]
    (out.parent / "hf").symlink_to(hf)  # lineage looks for the source beside the checkpoint
    manifest = load_checkpoint(out).manifest
    _sha_cache.clear()
    assert source_link(out, manifest).status == CURRENT
    with open(big, "r+b") as f:  # the stranger changes: still current
        f.write(b"x")
    _sha_cache.clear()
    assert source_link(out, manifest).status == CURRENT
    shard = sorted(hf.glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-4] + b"\0\0\0\0")  # a part changes: stale
    _sha_cache.clear()
    assert source_link(out, manifest).status == STALE


# --- P5: ceilings on sizes, before the allocation ---------------------------------------------------------------


def _within(seconds: float, call: object, *args: object) -> BaseException | None:
    """What ``call(*args)`` raised, run in a daemon thread: a read that blocks (a FIFO on main) fails the test
    instead of hanging it."""
    import threading

    got: list[BaseException | None] = []

    def run() -> None:
        try:
            call(*args)  # type: ignore[operator]
            got.append(None)
        except BaseException as e:  # noqa: BLE001 (handed to the test)
            got.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert got, f"{call} did not return in {seconds} s (blocked reading)"
    return got[0]


def test_labels_from_a_device_or_a_fifo_are_refused_before_reading(tmp_path: Path) -> None:
    """--labels /dev/zero held 4.9 GB then MemoryError; a FIFO hung. A device (/dev/null here: /dev/zero is refused
    by the same type check, and would hold memory on a failing run), a FIFO and an oversized file: one line each."""
    from vitdeploy.model.weights import read_labels
    from vitdeploy.model.zero_shot import read_class_names

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(65 << 20)
    for path, says in [("/dev/null", "a device, not a regular file"), (fifo, "a FIFO, not a regular file"),
                       (big, "more than the 67108864 this file may hold")]:
        for read in (read_labels, read_class_names):
            e = _within(20, read, path)
            assert isinstance(e, UsageError) and says in str(e), (path, e)


def test_an_image_size_past_the_range_is_refused_in_one_line_before_any_weights(hf: Path, tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``--image-size 10**30`` gave a C++ stack trace, 32000 died in the allocator at export, Eva 28000 took 4.7 GB."""
    import vitdeploy.model.importers as importers
    from vitdeploy.core.image_size import parse_image_size

    for text in ["1" + "0" * 30, "32000", "224x5000"]:
        with pytest.raises(UsageError, match="an input side must be from 1 to 4096 pixels"):
            parse_image_size(text)
    monkeypatch.setattr(importers, "load_any", lambda *a, **k: pytest.fail("weights read before the refusal"))
    with pytest.raises(UsageError, match="from 1 to 4096"):
        importers.import_checkpoint(hf, tmp_path / "c.pth", image_size=(10**30, 10**30))


def test_a_processor_size_past_the_range_is_refused_naming_the_processor_config(hf: Path) -> None:
    """A processor ``size`` of 48000 took 5 GB resampling position embeddings, then died in the allocator."""
    (hf / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 48000, "width": 48000}}))
    with pytest.raises(VitdeployError, match=r"preprocessor_config\.json: size\.height 48000 must be a whole number from 1 to 4096"):
        _load(hf)


def test_a_safetensors_file_is_mapped_not_read_whole_into_memory(tmp_path: Path) -> None:
    """A 20 GB model.safetensors was read into one bytes object, then parsed: twice its size. safetensors' own
    ``safe_open`` maps it; Python holds at most the hash's 1 MB chunk (tracemalloc sees bytes, not torch storage)."""
    from safetensors.torch import save_file

    from vitdeploy.model.weights import _safetensors_load

    f = tmp_path / "w.safetensors"
    save_file({"w": torch.zeros(4 << 20)}, f)  # 16 MB
    tracemalloc.start()
    try:
        sd = _safetensors_load(f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sd["w"].numel() == 4 << 20 and peak < 4 << 20, peak


def test_tensors_read_from_a_safetensors_file_outlive_its_truncation(tmp_path: Path) -> None:
    """The map is only a way in: tensors left on it would crash the process (SIGBUS) once the file is truncated in
    place (a `cp` over it while import runs). Run apart, so a crash fails this test and not the whole session."""
    import subprocess
    import sys

    code = ("import sys, torch\nfrom pathlib import Path\nfrom safetensors.torch import save_file\n"
            "from vitdeploy.model.weights import _safetensors_load\n"
            "p = Path(sys.argv[1]); save_file({'w': torch.ones(1 << 20)}, p)\n"
            "sd = _safetensors_load(p); open(p, 'wb').close()\nprint(int(sd['w'].sum()))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "w.safetensors")], capture_output=True, text=True,
                       timeout=120)
    assert (r.returncode, r.stdout.strip()) == (0, str(1 << 20)), (r.returncode, r.stderr[-2000:])


def test_infer_never_advises_a_batch_of_one_or_less(monkeypatch: pytest.MonkeyPatch) -> None:
    """infer on a 32000-px checkpoint said "use --batch-size 1 or less": where one image does not fit, it says so."""
    import vitdeploy.tools.bench as bench
    from vitdeploy.tools.infer import check_batch_fits

    class M:  # the two fields check_batch_fits reads of a manifest
        input_size = (4096, 4096)
        model = {"embed_dim": 768, "depth": 12, "num_heads": 12, "patch_size": 16, "mlp_dim": 3072}

    monkeypatch.setattr(bench, "available_memory", lambda: 1 << 20)
    for b in (1, 8):
        with pytest.raises(VitdeployError) as e:
            check_batch_fits(M(), b)
        assert "or less" not in str(e.value) and "one image of this model (4096x4096 input)" in str(e.value)


# --- P6 and the CLI: one line, the exit code, nothing written ---------------------------------------------------


def test_import_refusals_on_the_command_line(hf: Path, tmp_path: Path) -> None:
    """Each hostile folder or option: one line, the documented exit code, no traceback, nothing written."""
    from safetensors.torch import load_file

    bin_only = tmp_path / "binonly"
    bin_only.mkdir()
    shutil.copy(hf / "config.json", bin_only / "config.json")
    sd: dict[str, torch.Tensor] = {}
    for s in hf.glob("model-*.safetensors"):
        sd.update(load_file(s))
    torch.save(sd, bin_only / "pytorch_model.bin")
    outside = tmp_path / "outside.safetensors"
    shutil.copy(sorted(hf.glob("model-*.safetensors"))[0], outside)
    escape = tmp_path / "escape"
    shutil.copytree(hf, escape)
    _first_shard_to(escape, "../outside.safetensors")
    listmap = tmp_path / "listmap"
    shutil.copytree(hf, listmap)
    _set_index(listmap, ["x"])
    fifo = tmp_path / "labels.fifo"
    os.mkfifo(fifo)
    cases = [
        (["import", "escape", "-o", "a.pth"], 1, f"error: escape/{INDEX}: weight_map names '../outside.safetensors'"),
        (["import", "listmap", "-o", "a.pth"], 1, f"error: listmap/{INDEX}: weight_map is ['x'], not an object"),
        (["import", "hf", "--labels", "/dev/null", "-o", "a.pth"], 2, "error: --labels /dev/null: a device"),
        (["import", "hf", "--labels", str(fifo), "-o", "a.pth"], 2, f"error: --labels {fifo}: a FIFO"),
        (["import", "hf", "--image-size", "1" + "0" * 30, "-o", "a.pth"], 2, "error: --image-size 100000…(31 digits)"),
        (["import", "binonly", "-o", "binonly/model.safetensors"], 2,
         "error: -o binonly/model.safetensors is a file of the input folder binonly"),
        (["import", "hf", "-o", "x.onnx"], 2, "error: -o x.onnx: the name must end in .pth or .pt"),
        (["import", "hf", "-o", "x.txt"], 2, "error: -o x.txt: the name must end in .pth or .pt"),
    ]
    rows = run_cli_cases([argv for argv, _, _ in cases], tmp_path, timeout=150)
    for (argv, code, says), r in zip(cases, rows, strict=True):
        assert (r.code, len(r.lines())) == (code, 1) and r.lines()[0].startswith(says), (argv, r.code, r.stderr)
        assert "Traceback" not in r.stderr and r.changed == [], (argv, r.changed)
