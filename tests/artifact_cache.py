"""The digits model's artifacts (checkpoint, fp32/fp16/int8 ONNX), cached across runs (not a test module).

Each entry lives under ``.cache/test-artifacts/`` (gitignored, or ``$VITDEPLOY_TEST_CACHE``) in a folder named by a
hash of the source code that makes it, so a code change re-makes it and a fresh clone makes it once. An entry is
made under a lock, into a private folder renamed into place when complete: a killed run never leaves a half-made
entry, and several processes (pytest-xdist workers, the background maker below) never make one twice.

    python tests/artifact_cache.py    # make every entry now (conftest starts this in the background under xdist)

Why a background maker: on a fresh clone the checkpoint takes the longest of anything in the suite to make (20
epochs of training, about 70 CPU-seconds). Started by the xdist controller at session start, it trains while the
workers run the tests that need no artifact, and a worker that needs it sooner waits on the lock, leaving its core
to the maker. It trains on one thread: beside two busy workers on two cores, a second torch thread mostly spins
(measured with the earlier 12-epoch recipe: 60 CPU-seconds for the four entries on two threads, 41 for the checkpoint
alone on one).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CALIB = REPO / "calibration"  # the repository's default calibration images (digits scans)
CACHE_ROOT = Path(os.environ.get("VITDEPLOY_TEST_CACHE", REPO / ".cache" / "test-artifacts"))
# The shared digits checkpoint: what `vitdeploy train`'s code makes of the embedded set in 20 epochs at batch 32 with a
# 1-epoch warm-up. The accuracy tests (fp32/int8/fp16 agreement, ours vs NNCF's INT8, guard budgets) compare models
# that answer like it: on a weak model near-tied logits flip with any INT8 kernel, so the comparisons mean nothing
# (issue 37: at 66.94% top-1, NNCF's INT8 scored 2 images above FP32 on a VNNI CPU). So it must reach DIGITS_MIN_TOP1,
# checked where it is built (ckpt_entry). Measured (seed 0, one thread, digits val, 360 images): 6 epochs 66.94% in
# 20.5 CPU-s (the earlier recipe); 15 epochs 93.61%; 12 epochs at batch 16 83.06%; 20 epochs 98.06% (best epoch 15,
# >= 95% from epoch 14 on), 189 CPU-s on a machine at load 10 on 2 cores (about 68 CPU-s alone, by the 6-epoch rate).
# One thread: float sums split over threads round differently, so the same seed on 1 or 2 threads trains two different
# models; the suite must measure the same model whether the background maker, an xdist worker or a single process
# trains it.
DIGITS_TRAIN = {"epochs": 20, "batch_size": 32, "warmup_epochs": 1.0, "seed": 0, "threads": 1}
DIGITS_MIN_TOP1 = 0.95  # val top-1 the cached digits ViT must reach (issue 37)
KEEP_ENTRIES = 4  # cached entries kept per kind (ckpt, fp32, fp16, int8)
# The shared INT8 artifact: calibrate's defaults on the repository's calibration/ folder.
INT8_OPTIONS: dict[str, object] = {}


def code_hash(patterns: Iterable[str], *extra: object) -> str:
    """A short hash of the files under vitdeploy/ matching ``patterns`` plus ``extra``: the key of a cached artifact."""
    h = hashlib.sha256()
    for pattern in patterns:
        for f in sorted((REPO / "vitdeploy").glob(pattern)):
            h.update(str(f.relative_to(REPO)).encode())
            h.update(f.read_bytes())
    for e in extra:
        h.update(repr(e).encode())
    return h.hexdigest()[:16]


def cached_folder(key: str, make: Callable[[Path], None]) -> Path:
    """``CACHE_ROOT/key``, made by ``make(folder)`` when missing.

    ``make`` writes into a private folder that is renamed into place only when complete, so a killed run never
    leaves a half-made entry; concurrent runs (several pytest processes on one checkout) wait on a lock file."""
    final = CACHE_ROOT / key
    if final.is_dir():
        return final
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with open(CACHE_ROOT / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent run making the same entry: wait for it, do not make it twice
        if final.is_dir():
            return final
        for stale in CACHE_ROOT.glob(f".{key}.*.tmp"):  # a killed run's half-made entry (the lock is ours now)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = CACHE_ROOT / f".{key}.{os.getpid()}.tmp"
        tmp.mkdir()
        try:
            make(tmp)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    # keep the newest few entries of this kind (the key less its hash: "ckpt", "family-beit"): every code change makes
    # a new one. Per family, not one "family" kind: nine families under one kind of four evicted each other mid-run,
    # so every family test retrained its checkpoint
    kind = key.rsplit("-", 1)[0]
    for old in sorted(CACHE_ROOT.glob(f"{kind}-*"), key=lambda d: d.stat().st_mtime)[:-KEEP_ENTRIES]:
        shutil.rmtree(old, ignore_errors=True)
    return final


# --- the entries: each a key and a maker ---------------------------------------------------------------------------


def digits_key() -> str:
    # what training reads: the model, its data and the preprocessing (not every core module, which change often)
    return "ckpt-" + code_hash(["model/vit.py", "model/train.py", "model/data.py", "model/digits_split.py",
                                "model/checkpoint.py", "core/preprocess.py"], DIGITS_TRAIN)


def onnx_key() -> str:
    """The ONNX artifacts' key: all of vitdeploy's code and tables, the checkpoint's key, the calibration images."""
    calib = sorted(f"{f.name}:{f.stat().st_size}" for f in CALIB.iterdir())
    return code_hash(["**/*.py", "**/*.json"], digits_key(), INT8_OPTIONS, calib)


def ckpt_entry() -> Path:
    """The folder holding ``ckpt.pth``: the digits ViT trained by ``vitdeploy train``'s code for DIGITS_TRAIN."""

    def make(folder: Path) -> None:
        import torch

        from vitdeploy.model.train import TrainOptions, train

        threads = torch.get_num_threads()  # train sets torch's thread count; the rest of the session keeps its own
        start = time.process_time()
        try:
            res = train(None, TrainOptions(out=folder / "ckpt.pth", **DIGITS_TRAIN))  # type: ignore[arg-type]
        finally:
            torch.set_num_threads(threads)
        (folder / "trained.json").write_text(json.dumps({
            "val_top1": res.best_val_accuracy, "best_epoch": res.best_epoch, "cpu_seconds": time.process_time() - start,
            "recipe": DIGITS_TRAIN}))

    folder = cached_folder(digits_key(), make)
    trained = json.loads((folder / "trained.json").read_text())
    if trained["val_top1"] < DIGITS_MIN_TOP1:  # the suite's accuracy comparisons would compare near-ties: say so
        raise AssertionError(f"the cached digits ViT ({folder}) reached {trained['val_top1']:.2%} val top-1 with "
                             f"{DIGITS_TRAIN}, under the {DIGITS_MIN_TOP1:.0%} the accuracy tests need: train longer "
                             "(DIGITS_TRAIN in tests/artifact_cache.py)")
    return folder


def fp32_entry() -> Path:
    """The folder holding ``model.onnx``, the checkpoint's export (parity is the export tests' concern)."""

    def make(folder: Path) -> None:
        from vitdeploy.stages.export import export_onnx

        export_onnx(ckpt_entry() / "ckpt.pth", folder / "model.onnx", check=False)

    return cached_folder(f"fp32-{onnx_key()}", make)


def fp16_entry() -> Path:
    """The folder holding ``model.fp16.onnx``, made by convert_fp16 from the fp32 export."""

    def make(folder: Path) -> None:
        from vitdeploy.stages.precision import convert_fp16

        shutil.copy2(fp32_entry() / "model.onnx", folder / "model.onnx")
        convert_fp16(folder / "model.onnx", folder / "model.fp16.onnx")

    return cached_folder(f"fp16-{onnx_key()}", make)


def int8_entry() -> Path:
    """The folder holding ``model.int8.onnx`` and its calibration cache: calibrate's defaults on calibration/."""

    def make(folder: Path) -> None:
        from vitdeploy.stages.precision import calibrate

        shutil.copy2(fp32_entry() / "model.onnx", folder / "model.onnx")
        calibrate(folder / "model.onnx", CALIB, folder / "model.int8.onnx", **INT8_OPTIONS)  # type: ignore[arg-type]

    return cached_folder(f"int8-{onnx_key()}", make)


# A digits ViT of each family (tests/families.py): fewer epochs than the suite's checkpoint, since each family's
# test only needs a trained model to measure FP16/INT8 against, and eight of them are made on a fresh clone.
FAMILY_TRAIN = {"epochs": 4, "batch_size": 32, "warmup_epochs": 1.0, "seed": 0, "threads": 1}


def _train_family(folder: Path, name: str, knobs: dict[str, object], source: Path | None = None,
                  epochs: int | None = None) -> None:
    """``folder/ckpt.pth``: the vit-digits preset with the family's knobs, randomly initialised (or, from ``source``,
    its weights taken where the names and shapes agree: the position embedding's patch rows where one has a class
    token the other lacks), then fine-tuned by ``train --init``'s code for FAMILY_TRAIN (``epochs`` replacing its own)."""
    import torch

    from vitdeploy.core.manifest import Manifest
    from vitdeploy.model.checkpoint import load_checkpoint, save_checkpoint
    from vitdeploy.model.data import DIGITS_LABELS
    from vitdeploy.model.train import TrainOptions, train
    from vitdeploy.model.vit import VisionTransformer, get_preset

    preset = get_preset("vit-digits")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = VisionTransformer(preset.config.with_(**knobs))
        if source is not None:
            src = load_checkpoint(source).state_dict
            own = model.state_dict()
            for k, v in own.items():
                w = src.get(k)
                if w is not None and w.shape == v.shape:
                    own[k] = w
                elif k == "pos_embed" and w is not None and w.shape[1] > v.shape[1] and w.shape[2] == v.shape[2]:
                    own[k] = w[:, w.shape[1] - v.shape[1]:]  # the patch positions come last, after any prefix tokens
            model.load_state_dict(own)
        init = folder / "init.pth"
        save_checkpoint(init, model, Manifest(model=model.cfg.to_dict(), labels=list(DIGITS_LABELS),
                                              preprocess=dict(preset.preprocess), name=f"vit-digits-{name}"))
        opts = {**FAMILY_TRAIN, **({"epochs": epochs} if epochs is not None else {})}
        train(None, TrainOptions(out=folder / "ckpt.pth", init=init, **opts))  # type: ignore[arg-type]
        init.unlink()
    finally:
        torch.set_num_threads(threads)


def family_ckpt_entry(name: str, knobs: dict[str, object]) -> Path:
    """The folder holding ``ckpt.pth``: the vit-digits preset with the family's knobs, randomly initialised and
    fine-tuned from that by ``train --init``'s code (the config comes from the --init checkpoint) for FAMILY_TRAIN.

    A MAP-head model learns too slowly from scratch in those few epochs (16-17% val top-1, near-tied logits whose
    argmax any rounding flips: the families' INT8 agreement then measured the tie, 0.97 on one CPU), so it starts from
    the trained digits ViT's weights instead (warm_family_entry: the blocks carry over, the MAP head is new)."""
    if knobs.get("global_pool") == "map":
        return warm_family_entry(name, knobs, ckpt_entry() / "ckpt.pth", epochs=3)
    key = code_hash(["model/*.py", "core/preprocess.py"], sorted(knobs.items()), FAMILY_TRAIN)
    return cached_folder(f"family-{name}-{key}", lambda folder: _train_family(folder, name, knobs))


def warm_family_entry(name: str, knobs: dict[str, object], source: Path, epochs: int = 3) -> Path:
    """The folder holding ``ckpt.pth``: the family's model started from the trained checkpoint ``source`` (the rest —
    a MAP head, a projection, a new classifier — initialised), then fine-tuned for ``epochs``. For a family that
    learns too slowly from scratch in FAMILY_TRAIN's few epochs (the MAP head: 16% val top-1 after 4 epochs, its pooled
    vectors nearly one per cluster), or a knob the family cache does not train (CLIP's projection), at a fraction of a
    fresh training's cost."""
    key = code_hash(["model/*.py", "core/preprocess.py"], sorted(knobs.items()), source.parent.name, epochs,
                    FAMILY_TRAIN)
    return cached_folder(f"warm-{name}-{key}", lambda folder: _train_family(folder, name, knobs, source, epochs))


PROBE_SCRIPT = REPO / "scripts" / "probe_bad_inputs.py"


def probe_scratch_entry() -> Path:
    """The bad-input probe's scratch folder (``scripts/probe_bad_inputs.py --scratch``) on the digits checkpoint:
    made once for every worker and run, not once per worker (the files it writes cost about 3 CPU-s). Its model.onnx
    is the fp32 entry's: ``vitdeploy export ckpt.pth --no-check`` of the same checkpoint writes the same bytes, and
    the copy saves that export (2.7 CPU-s)."""

    def make(folder: Path) -> None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("probe_bad_inputs", PROBE_SCRIPT)
        assert spec is not None and spec.loader is not None
        probe = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look themselves up
        spec.loader.exec_module(probe)
        (folder / "scratch").mkdir()  # where the script's --scratch looks; cached_folder already locks and renames
        probe.make_scratch(folder / "scratch", REPO, ckpt_entry() / "ckpt.pth", fp32_entry() / "model.onnx")

    script = hashlib.sha256(PROBE_SCRIPT.read_bytes()).hexdigest()
    return cached_folder(f"probe-{code_hash(['**/*.py', '**/*.json'], digits_key(), script)}", make)


# in the order the suite first needs them
ENTRIES = (ckpt_entry, fp32_entry, int8_entry, fp16_entry, probe_scratch_entry)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    for entry in ENTRIES:
        entry()
    from families import FAMILIES, knobs  # beside this file: the family checkpoints last, after what most tests need

    for family_name in FAMILIES:
        try:
            family_ckpt_entry(family_name, knobs(family_name))
        except (TypeError, ValueError):  # a knob this tree's model lacks: the family's tests fail and say so
            continue
