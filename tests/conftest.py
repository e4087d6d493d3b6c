"""Shared fixtures: real images (scikit-learn digits, scikit-image photos) written by the tests, and the digits
model's artifacts (checkpoint, fp32/fp16/int8 ONNX, bundle), each made once per session.

The checkpoint and the ONNX artifacts are also cached across runs under ``.cache/test-artifacts/`` (gitignored), in
a folder named by a hash of the source code that makes them, so a code change re-makes them and a fresh clone makes
them once. Session artifacts are shared: a test that writes into their folder or changes a file must work on a copy
(the ``copy_artifact`` fixture).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from helpers import MODES, save_in_mode
from PIL import Image

os.environ.setdefault("OMP_NUM_THREADS", "2")

REPO = Path(__file__).resolve().parents[1]
CALIB = REPO / "calibration"  # the repository's default calibration images (digits scans)
CACHE_ROOT = Path(os.environ.get("VITDEPLOY_TEST_CACHE", REPO / ".cache" / "test-artifacts"))
# The shared digits checkpoint: what `vitdeploy train` does on the embedded set, few enough epochs to be quick, enough
# for the accuracy tests (fp32/int8/fp16 agreement, guard budgets) to measure a trained model.
DIGITS_TRAIN = {"epochs": 12, "seed": 0}
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
    kind = key.split("-")[0]  # keep the newest few entries of this kind: every code change makes a new one
    for old in sorted(CACHE_ROOT.glob(f"{kind}-*"), key=lambda d: d.stat().st_mtime)[:-KEEP_ENTRIES]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def session_copy(src: Path, tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A session-private copy of a cached folder, so no test can change the cache itself."""
    dst = tmp_path_factory.mktemp(name) / name
    shutil.copytree(src, dst)
    return dst


def copy_into(src: Path, dst_dir: Path) -> Path:
    """Copy an artifact (a file, its ONNX external data and calibration cache, or a folder) into ``dst_dir``."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst_dir / src.name)
        return dst_dir / src.name
    for name in (src.name, src.name + ".data", src.stem + ".calib.json"):  # external data, calibration cache
        if (src.parent / name).is_file():
            shutil.copy2(src.parent / name, dst_dir / name)
    return dst_dir / src.name




@pytest.fixture(scope="session")
def digits_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded digits set written as an ImageFolder (train/, val/) of PNGs."""
    from vitdeploy.model.data import write_digits

    out = tmp_path_factory.mktemp("digits")
    write_digits(out)
    return out


@pytest.fixture(scope="session")
def digits_val10(digits_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 images per class of the digits val split: a labeled ImageFolder small enough for many runs (read-only)."""
    root = tmp_path_factory.mktemp("val10")
    for d in sorted((digits_folder / "val").iterdir()):
        (root / d.name).mkdir()
        for f in sorted(d.iterdir())[:10]:
            shutil.copy(f, root / d.name / f.name)
    return root


@pytest.fixture(scope="session")
def mixed_mode_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-class ImageFolder of real digit scans saved in every PIL mode, at various sizes."""
    from vitdeploy.model.data import digits_images

    imgs, y = digits_images()
    root = tmp_path_factory.mktemp("mixed")
    counts: dict[int, int] = {}
    for i, (img, label) in enumerate(zip(imgs, y, strict=True)):
        if label > 2 or counts.get(label, 0) >= 12:
            continue
        n = counts.get(label, 0)
        counts[label] = n + 1
        d = root / f"class_{label}"
        d.mkdir(exist_ok=True)
        size = (16 + 8 * (n % 3), 16 + 4 * (n % 2))
        save_in_mode(img.resize(size, Image.Resampling.BILINEAR), d / f"img{i}", MODES[n % len(MODES)])
    return root


def _train_digits(folder: Path) -> None:
    from vitdeploy.model.train import TrainOptions, train

    train(None, TrainOptions(out=folder / "ckpt.pth", **DIGITS_TRAIN))  # type: ignore[arg-type]


def _digits_key() -> str:
    # what training reads: the model, its data and the preprocessing (not every core module, which change often)
    return "ckpt-" + code_hash(["model/vit.py", "model/train.py", "model/data.py", "model/checkpoint.py", "core/preprocess.py"], DIGITS_TRAIN)


@pytest.fixture(scope="session")
def digits_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A digits ViT trained for a few epochs on the embedded set (shared by export/verify/precision tests)."""
    return session_copy(cached_folder(_digits_key(), _train_digits), tmp_path_factory, "ckpt") / "ckpt.pth"


def _onnx_key() -> str:
    """The ONNX artifacts' key: all of vitdeploy's code and tables, the checkpoint's key, the calibration images."""
    calib = sorted(f"{f.name}:{f.stat().st_size}" for f in CALIB.iterdir())
    return code_hash(["**/*.py", "**/*.json"], _digits_key(), INT8_OPTIONS, calib)


@pytest.fixture(scope="session")
def _models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's folder of ONNX artifacts (each copied in from the cache when first asked for)."""
    return tmp_path_factory.mktemp("models")


def _cached_onnx(kind: str, make: Callable[[Path], None], models: Path, names: tuple[str, ...]) -> Path:
    """Copy the files ``names`` of the cached entry ``kind`` (made by ``make`` when missing) into ``models``."""
    src = cached_folder(f"{kind}-{_onnx_key()}", make)
    for name in names:
        shutil.copy2(src / name, models / name)
    return models / names[0]


@pytest.fixture(scope="session")
def digits_onnx(digits_ckpt: Path, _models_dir: Path) -> Path:
    """The digits model's fp32 ONNX export (shared: copy it before changing it or writing beside it)."""

    def make(folder: Path) -> None:
        from vitdeploy.stages.export import export_onnx

        export_onnx(digits_ckpt, folder / "model.onnx", check=False)  # parity is the export tests' concern

    return _cached_onnx("fp32", make, _models_dir, ("model.onnx",))


@pytest.fixture(scope="session")
def digits_fp16(digits_onnx: Path, _models_dir: Path) -> Path:
    """The digits model converted to FP16 by convert_fp16 (shared: copy it before changing it)."""

    def make(folder: Path) -> None:
        from vitdeploy.stages.precision import convert_fp16

        shutil.copy2(digits_onnx, folder / "model.onnx")
        convert_fp16(folder / "model.onnx", folder / "model.fp16.onnx")

    return _cached_onnx("fp16", make, _models_dir, ("model.fp16.onnx",))


@pytest.fixture(scope="session")
def digits_int8(digits_onnx: Path, _models_dir: Path) -> Path:
    """The digits model calibrated to INT8 Q/DQ by calibrate with its defaults on calibration/ (500 images), with
    its calibration cache beside it (shared: copy it before changing it)."""

    def make(folder: Path) -> None:
        from vitdeploy.stages.precision import calibrate

        shutil.copy2(digits_onnx, folder / "model.onnx")
        calibrate(folder / "model.onnx", CALIB, folder / "model.int8.onnx", **INT8_OPTIONS)  # type: ignore[arg-type]

    return _cached_onnx("int8", make, _models_dir, ("model.int8.onnx", "model.int8.calib.json"))


@pytest.fixture(scope="session")
def digits_artifacts(digits_onnx: Path, digits_fp16: Path, digits_int8: Path) -> Path:
    """A folder with the digits model as the pipeline writes it by default: model.onnx (export), model.fp16.onnx
    (convert-fp16), model.int8.onnx and model.int8.calib.json (calibrate on calibration/), each with its manifest."""
    return digits_onnx.parent


@pytest.fixture(scope="session")
def digits_bundle(digits_artifacts: Path, digits_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle of the digits model's int8, fp32 and fp16 artifacts, checked on 12 val images (shared: copy it)."""
    from vitdeploy.stages.bundle import BundleOptions, bundle

    out = tmp_path_factory.mktemp("bundle") / "bundle"
    opts = BundleOptions(opt_batch=4, max_batch=16, check_images=[digits_folder / "val"], references=12)
    bundle([digits_artifacts / "model.int8.onnx", digits_artifacts / "model.onnx", digits_artifacts / "model.fp16.onnx"], out,
           opts)
    return out


@pytest.fixture
def copy_artifact(tmp_path: Path) -> Callable[[Path], Path]:
    """Copy a shared artifact (file with its side files, or a folder) into this test's tmp_path before changing it."""
    return lambda src: copy_into(src, tmp_path)


@pytest.fixture(scope="session")
def photo_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Real photographs from scikit-image's sample data, written as JPEG and PNG."""
    from skimage import data

    root = tmp_path_factory.mktemp("photos")
    out = []
    for name in ("astronaut", "coffee", "chelsea", "camera", "rocket"):
        arr = getattr(data, name)()
        p = root / f"{name}.{'png' if name == 'camera' else 'jpg'}"
        Image.fromarray(arr).save(p)
        out.append(p)
    return out
