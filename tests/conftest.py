"""Shared fixtures: real images (scikit-learn digits, scikit-image photos) written by the tests, and the digits
model's artifacts (checkpoint, fp32/fp16/int8 ONNX, bundle), each made once per session.

The checkpoint and the ONNX artifacts are also cached across runs (``tests/artifact_cache.py``: under
``.cache/test-artifacts/``, gitignored, in a folder named by a hash of the source code that makes them), so a code
change re-makes them and a fresh clone makes them once. Session artifacts are shared: a test that writes into their folder or changes a file must work on a copy
(the ``copy_artifact`` fixture).
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def _share_the_cores() -> None:
    """Under pytest-xdist (``make test`` runs one worker per core), give each worker its own share of the cores.

    vitdeploy sizes its thread pools by the affinity mask (``core.host.available_cores``): without a share, every
    worker and every command it starts would spin a pool as wide as the machine, and on CI's 2 cores two workers'
    ONNX Runtime pools fight over the same cores. So worker i of n keeps cores i, i+n, ... (the commands it starts
    inherit that), and OMP_NUM_THREADS, which torch reads when it is first imported, matches the share.

    It runs before this module imports numpy (below): OpenBLAS sizes its pool and starts its threads when numpy is
    first imported, and threads started before the pinning keep the whole machine. Measured: one such OpenBLAS
    thread per worker, spinning on the other worker's core, made the one-command bundle test cost 20 CPU-s instead
    of 11 (``test_worker_threads.py`` checks the pool)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if worker.startswith("gw") and count > 1 and len(cores) >= count:
        share = cores[int(worker[2:]) % count :: count]
        os.sched_setaffinity(0, share)
        os.environ["OMP_NUM_THREADS"] = str(len(share))
    os.environ.setdefault("OMP_NUM_THREADS", str(min(len(cores) or 2, 2)))


_share_the_cores()

import artifact_cache  # noqa: E402  (after the pinning: these import numpy)
import pytest  # noqa: E402
from helpers import MODES, save_in_mode  # noqa: E402
from PIL import Image  # noqa: E402


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


@pytest.fixture(scope="session")
def digits_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A digits ViT trained for a few epochs on the embedded set (shared by export/verify/precision tests)."""
    return session_copy(artifact_cache.ckpt_entry(), tmp_path_factory, "ckpt") / "ckpt.pth"


@pytest.fixture(scope="session")
def _models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's folder of ONNX artifacts (each copied in from the cache when first asked for)."""
    return tmp_path_factory.mktemp("models")


def _copy_entry(src: Path, models: Path, names: tuple[str, ...]) -> Path:
    """Copy the files ``names`` of the cached entry ``src`` into the session's ``models`` folder."""
    for name in names:
        shutil.copy2(src / name, models / name)
    return models / names[0]


@pytest.fixture(scope="session")
def digits_onnx(digits_ckpt: Path, _models_dir: Path) -> Path:
    """The digits model's fp32 ONNX export (shared: copy it before changing it or writing beside it)."""
    return _copy_entry(artifact_cache.fp32_entry(), _models_dir, ("model.onnx",))


@pytest.fixture(scope="session")
def digits_fp16(digits_onnx: Path, _models_dir: Path) -> Path:
    """The digits model converted to FP16 by convert_fp16 (shared: copy it before changing it)."""
    return _copy_entry(artifact_cache.fp16_entry(), _models_dir, ("model.fp16.onnx",))


@pytest.fixture(scope="session")
def digits_int8(digits_onnx: Path, _models_dir: Path) -> Path:
    """The digits model calibrated to INT8 Q/DQ by calibrate with its defaults on calibration/ (500 images), with
    its calibration cache beside it (shared: copy it before changing it)."""
    return _copy_entry(artifact_cache.int8_entry(), _models_dir, ("model.int8.onnx", "model.int8.calib.json"))


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


# --- a fresh clone: the order of the modules, and the background maker (pytest-xdist's controller only) -----------

_ARTIFACT_FIXTURES = {"digits_ckpt", "digits_onnx", "digits_fp16", "digits_int8", "digits_artifacts", "digits_bundle"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules whose tests need none of the cached artifacts run first, the others after them, each module's tests
    kept together and in order (its module fixtures are made once): on a fresh clone the background maker has
    the artifacts ready by the time they are asked for. Every worker sorts the same collection the same way."""
    def module(it: pytest.Item) -> str:
        return it.nodeid.split("::")[0]

    needs = {module(it) for it in items if _ARTIFACT_FIXTURES & set(getattr(it, "fixturenames", ()))}
    items.sort(key=lambda it: module(it) in needs)  # stable: collection order within each group


def pytest_collection_finish(session: pytest.Session) -> None:
    """Less time in Python's cyclic garbage collector: what exists after collection (torch, onnx, the test modules:
    about 200,000 objects) is moved out of its reach, and the youngest generation is collected every 10,000 new
    objects instead of 700 (the protobuf and graph objects of export and calibration come by the hundred thousand).
    Measured over test_conformance, test_precision, test_export and test_bundle_one_command in one process:
    3.40 CPU-s in collections before, 1.06 after. Only the test processes: the product's defaults are untouched."""
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under xdist, the controller (which runs no test) makes the cached artifacts in the background, unpinned, while
    the workers start on the tests that need none (``tests/artifact_cache.py`` says why)."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    # its output is dropped: if it fails, a worker makes that entry itself in the test that needs it, and fails there
    config._artifact_maker = subprocess.Popen(  # type: ignore[attr-defined]
        [sys.executable, str(Path(__file__).with_name("artifact_cache.py"))],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"})  # one thread: beside the workers, more would spin, not train


def pytest_sessionfinish(session: pytest.Session) -> None:
    maker = getattr(session.config, "_artifact_maker", None)
    if maker is not None and maker.poll() is None:  # the run ended first (-k, -x, Ctrl-C): stop it; its lock goes too
        maker.kill()
        maker.wait()
