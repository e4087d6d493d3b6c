"""The bundle's C++ library and example (bundle_files/cpp): compiled against every TensorRT header set, and the
GPU-free part run here against run.py on real images (issue 16).

- syntax: g++ -std=c++17 -fsyntax-only -Werror against ../shared/tensorrt-include/{8.6,10.3,10.16,11.1} and the
  CUDA runtime headers of PyPI's nvidia-cuda-runtime / nvidia-cuda-crt wheels (installed into a session folder);
- run: the bundle's classify.cpp + vitclassify.cpp built with Debian's libopencv-dev and tests/cpp/stub_engine.cpp
  (Classifier::open without TensorRT, see there), fed PNGs and JPEGs in several modes and sizes; its packed
  uint8 batches are compared with what run.py (imported from the bundle folder) feeds the raw-pixel model;
- tensorrt: where TensorRT and a GPU exist, the real example built with cmake on the bundle's engine vs run.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import PIL
import pytest
from cpp_helpers import OPENCV_INCLUDE, build_with_stub, dumped, gxx, stub_engine
from helpers import load_run_py
from PIL import Image

from vitdeploy.stages.bundle import BundleOptions, bundle

# `make test` leaves these out (`make test-all` and CI run them): the C++ example compiled against four TensorRT header sets and OpenCV (33 test-s of 920)
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CPP = REPO / "vitdeploy" / "stages" / "bundle_files" / "cpp"
TRT_VERSIONS = ("8.6", "10.3", "10.16", "11.1")
TRT_MAJOR = {"8.6": (8, 6), "10.3": (10, 3), "10.16": (10, 16), "11.1": (11, 1)}
PIL_ORDER = "pillow13" if int(PIL.__version__.split(".")[0]) >= 13 else "horizontal"  # as bundle.py writes it


def tensorrt_include_root() -> Path | None:
    """../shared/tensorrt-include beside the checkout (CI), or beside the main checkout of a git worktree."""
    cands = [os.environ.get("VITDEPLOY_TENSORRT_INCLUDE"), REPO.parent / "shared" / "tensorrt-include"]
    try:
        common = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
        if common:
            cands.append(str(Path(common).parent.parent / "shared" / "tensorrt-include"))
    except (OSError, subprocess.SubprocessError):
        pass
    for c in cands:
        if c and Path(c).is_dir():
            return Path(c)
    return None


@pytest.fixture(scope="session")
def cuda_include(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cuda_runtime_api.h and crt/ from PyPI's CUDA 13 wheels, pip-installed once per session."""
    if os.environ.get("VITDEPLOY_CUDA_INCLUDE"):
        return Path(os.environ["VITDEPLOY_CUDA_INCLUDE"])
    target = tmp_path_factory.mktemp("cuda-headers")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(target),
           "--no-deps", "nvidia-cuda-runtime", "nvidia-cuda-crt"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot pip-install the CUDA runtime headers: {e}")
    found = sorted(target.rglob("cuda_runtime_api.h"))
    if r.returncode != 0 or not found:
        tail = (r.stderr.strip().splitlines() or ["no cuda_runtime_api.h in the wheels"])[-1]
        pytest.skip(f"cannot pip-install nvidia-cuda-runtime/nvidia-cuda-crt for the CUDA headers: {tail}")
    inc = found[0].parent
    if not (inc / "crt" / "host_defines.h").exists():
        pytest.skip(f"{inc}: no crt/ headers (nvidia-cuda-crt)")
    return inc


@pytest.mark.parametrize("version", TRT_VERSIONS)
def test_library_and_example_compile_against_tensorrt_headers(version: str, cuda_include: Path, tmp_path: Path) -> None:
    root = tensorrt_include_root()
    if root is None:
        pytest.skip("no ../shared/tensorrt-include beside the checkout (set VITDEPLOY_TENSORRT_INCLUDE)")
    trt = root / version
    if not (trt / "NvInfer.h").exists():
        pytest.skip(f"{trt}: no NvInfer.h")
    if not (OPENCV_INCLUDE / "opencv2" / "core.hpp").exists():
        pytest.skip("OpenCV headers missing (Debian: apt-get install libopencv-dev; .ci/run installs it)")
    g = gxx()
    # the headers really are that version: a static_assert on the macros the library's #if reads
    probe = tmp_path / "version.cpp"
    major, minor = TRT_MAJOR[version]
    probe.write_text(f"#include <NvInferVersion.h>\nstatic_assert(NV_TENSORRT_MAJOR == {major} && NV_TENSORRT_MINOR == {minor});\n")
    flags = ["-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", f"-I{CPP}", "-isystem", str(OPENCV_INCLUDE),
             "-isystem", str(trt), "-isystem", str(cuda_include)]
    for src in (probe, CPP / "vitclassify.cpp", CPP / "vitclassify_trt.cpp", CPP / "classify.cpp"):
        r = subprocess.run([g, *flags, str(src)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{src.name} against TensorRT {version}:\n{r.stderr[-4000:]}"


# ------------------------------------------------------------------------------------------- the bundle


@pytest.fixture(scope="module")
def bundle_dir(digits_onnx: Path, digits_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cppb")
    shutil.copy2(digits_onnx, d / "model.onnx")
    out = d / "bundle"
    bundle([d / "model.onnx"], out, BundleOptions(check_images=[digits_folder / "val"], references=11))
    return out


def test_bundle_writes_cpp_and_its_facts(bundle_dir: Path) -> None:
    for f in ("CMakeLists.txt", "vitclassify.h", "vitclassify.cpp", "vitclassify_trt.cpp", "classify.cpp", "bundle.cfg"):
        assert (bundle_dir / "cpp" / f).is_file(), f
    man = json.loads((bundle_dir / "manifest.json").read_text())
    cfg = dict(ln.split("=", 1) for ln in (bundle_dir / "cpp" / "bundle.cfg").read_text().splitlines() if ln and ln[0] != "#")
    pp = man["preprocess"]
    assert [int(cfg["input_height"]), int(cfg["input_width"])] == pp["input_size"]
    assert (cfg["resize_mode"], cfg["interpolation"], float(cfg["crop_pct"])) == (pp["resize_mode"], pp["interpolation"], pp["crop_pct"])
    assert cfg["resample_order"] == PIL_ORDER
    assert int(cfg["num_classes"]) == len(man["labels"])
    assert (bundle_dir / "cpp" / cfg["labels"]).resolve() == (bundle_dir / "labels.txt").resolve()
    default = man["bundle"]["default_model"]
    assert cfg["engine"] == "../" + default.replace(".onnx", ".engine")
    assert man["bundle"]["artifacts"][default]["input"]["dtype"] == "uint8"
    assert man["bundle"]["artifacts"][default]["input"]["layout"] == "NHWC"  # what the C++ side packs
    for f in CPP.iterdir():  # the shipped copy is the template
        if f.is_file():
            assert (bundle_dir / "cpp" / f.name).read_bytes() == f.read_bytes()


def test_package_data_ships_the_cpp_sources() -> None:
    from importlib.resources import files

    cpp = files("vitdeploy.stages") / "bundle_files" / "cpp"
    assert {"CMakeLists.txt", "vitclassify.h", "vitclassify.cpp", "vitclassify_trt.cpp", "classify.cpp"} <= {p.name for p in cpp.iterdir()}
    text = (REPO / "pyproject.toml").read_text()
    assert '"vitdeploy.stages" = ["bundle_files/*", "bundle_files/**/*"]' in text


# ------------------------------------------------------------------------------------------- stub build


@pytest.fixture(scope="module")
def classify_bin(bundle_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle's classify.cpp + vitclassify.cpp with the test stub for the engine, linked with libopencv."""
    return build_with_stub(bundle_dir / "cpp", tmp_path_factory.mktemp("cppbin") / "classify")


@pytest.fixture(scope="module")
def test_images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Digit scans (sklearn) and photos (scikit-image) in several PIL modes and sizes, as PNG and as JPEG."""
    from skimage import data

    from vitdeploy.model.data import digits_images

    root = tmp_path_factory.mktemp("cppimg")
    digits, _ = digits_images()
    png: list[Path] = []
    jpg: list[Path] = []
    modes = ["L", "LA", "P", "RGBA", "RGB", "I;16", "1"]
    sizes = [(8, 8), (16, 24), (40, 28), (57, 33), (100, 100), (13, 70), (33, 57)]
    for i, (mode, size) in enumerate(zip(modes * 2, sizes + sizes[::-1], strict=True)):
        img = digits[i * 7].resize(size, Image.Resampling.BILINEAR)
        p = root / f"digit{i:02d}_{mode.replace(';', '')}_{size[0]}x{size[1]}.png"
        if mode == "I;16":
            Image.fromarray(np.asarray(img, np.uint16) * 257).save(p)
        else:
            img.convert(mode).save(p)
        png.append(p)
    for name, mode, size in [("astronaut", "RGB", None), ("coffee", "RGBA", None), ("chelsea", "P", (150, 113)),
                             ("camera", "L", (97, 203)), ("rocket", "LA", (320, 213)), ("coffee", "RGB", (61, 41))]:
        img = Image.fromarray(getattr(data, name)())
        if size:
            img = img.resize(size, Image.Resampling.LANCZOS)
        p = root / f"photo_{name}_{mode}_{img.size[0]}x{img.size[1]}.png"
        img.convert(mode).save(p)
        png.append(p)
    for name, mode, size in [("astronaut", "RGB", None), ("coffee", "RGB", (300, 200)), ("chelsea", "RGB", None),
                             ("camera", "L", None), ("rocket", "RGB", (90, 135))]:
        img = Image.fromarray(getattr(data, name)())
        if size:
            img = img.resize(size, Image.Resampling.BICUBIC)
        p = root / f"photo_{name}_{mode}_{img.size[0]}x{img.size[1]}.jpg"
        img.convert(mode).save(p, quality=90)
        jpg.append(p)
    for i, size in enumerate([(24, 24), (64, 40), (9, 31)]):
        p = root / f"digit_jpeg{i}_{size[0]}x{size[1]}.jpg"
        digits[100 + i].resize(size, Image.Resampling.BICUBIC).convert("RGB").save(p, quality=85)
        jpg.append(p)
    return {"png": png, "jpg": jpg}


def cpp_batch(binary: Path, files: list[Path], folder: Path, cfg: Path, h: int, w: int, classes: int) -> np.ndarray:
    """The uint8 NHWC batch the C++ side packs for these images (one call, no padding)."""
    eng, dump = stub_engine(folder, h, w, classes)
    r = subprocess.run([str(binary), "--config", str(cfg), "--batch", "100000", str(eng), *map(str, files)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (x,) = dumped(dump, h, w)
    return x


def run_py_batch(run_py: types.ModuleType, files: list[Path], pp: dict, spec: dict) -> np.ndarray:
    """What run.py feeds the model: its load_resized for each file, then its model_input for the input spec."""
    return run_py.model_input(np.stack([run_py.load_resized(f, pp) for f in files]), spec, pp)


def bundle_facts(bundle_dir: Path) -> tuple[dict, dict, int]:
    man = json.loads((bundle_dir / "manifest.json").read_text())
    spec = man["bundle"]["artifacts"][man["bundle"]["default_model"]]["input"]
    return man["preprocess"], spec, len(man["labels"])


def test_png_batch_is_byte_identical_to_run_py(bundle_dir: Path, classify_bin: Path, test_images: dict[str, list[Path]],
                                                tmp_path: Path) -> None:
    run_py = load_run_py(bundle_dir / "run.py")
    pp, spec, classes = bundle_facts(bundle_dir)
    h, w = pp["input_size"]
    files = test_images["png"]
    assert len(files) + len(test_images["jpg"]) >= 20
    got = cpp_batch(classify_bin, files, tmp_path, bundle_dir / "cpp" / "bundle.cfg", h, w, classes)
    want = run_py_batch(run_py, files, pp, spec)
    assert want.dtype == np.uint8 and want.shape == got.shape == (len(files), h, w, 3)
    for f, a, b in zip(files, got, want, strict=True):
        assert np.array_equal(a, b), f"{f.name}: {int((a != b).sum())} bytes differ, max {int(np.abs(a.astype(int) - b).max())}"


# Pillow's other filters and geometries, on the same PNGs: run.py's resize_crop with these preprocess blocks
PP_VARIANTS = [
    {"input_size": [24, 40], "resize_mode": "shorter", "crop_pct": 0.9, "interpolation": "bilinear"},
    {"input_size": [32, 32], "resize_mode": "shorter", "crop_pct": 0.875, "interpolation": "nearest"},
    {"input_size": [30, 20], "resize_mode": "squash", "crop_pct": 1.0, "interpolation": "lanczos"},
    {"input_size": [224, 224], "resize_mode": "shorter", "crop_pct": 0.95, "interpolation": "box"},
    {"input_size": [17, 33], "resize_mode": "squash", "crop_pct": 1.0, "interpolation": "hamming"},
    {"input_size": [48, 48], "resize_mode": "shorter", "crop_pct": 1.0, "interpolation": "bicubic"},
    # transformers' DeiT/BEiT processors (resize to a size, then crop) and its floor-rounded crop offset
    {"input_size": [32, 32], "resize_mode": "squash_crop", "crop_pct": 0.8, "interpolation": "bicubic",
     "crop_offset": "floor"},
    {"input_size": [31, 31], "resize_mode": "shorter", "crop_pct": 0.875, "interpolation": "bilinear",
     "crop_offset": "floor"},
]


@pytest.mark.parametrize("pp", PP_VARIANTS, ids=lambda p: f"{p['interpolation']}-{p['resize_mode']}-{p['input_size'][0]}x{p['input_size'][1]}")
def test_png_resize_identical_for_every_pillow_filter(pp: dict, bundle_dir: Path, classify_bin: Path,
                                                       test_images: dict[str, list[Path]], tmp_path: Path) -> None:
    run_py = load_run_py(bundle_dir / "run.py")
    h, w = pp["input_size"]
    cfg = tmp_path / "bundle.cfg"
    cfg.write_text(f"input_height={h}\ninput_width={w}\nresize_mode={pp['resize_mode']}\ncrop_pct={pp['crop_pct']!r}\n"
                   f"interpolation={pp['interpolation']}\nresample_order={PIL_ORDER}\nlabels=labels.txt\n"
                   + (f"crop_offset={pp['crop_offset']}\n" if "crop_offset" in pp else ""))
    (tmp_path / "labels.txt").write_text("a\nb\n")
    files = test_images["png"]
    got = cpp_batch(classify_bin, files, tmp_path, cfg, h, w, 2)
    for f, a in zip(files, got, strict=True):
        b = run_py.load_resized(f, pp)
        assert np.array_equal(a, b), f"{f.name}: {int((a != b).sum())} bytes differ"


def test_horizontal_order_is_pillow12s_two_single_passes(bundle_dir: Path, classify_bin: Path,
                                                         test_images: dict[str, list[Path]], tmp_path: Path) -> None:
    """resample_order=horizontal (Pillow <= 12, e.g. JetPack's python3-pil): a horizontal-only resize, then a
    vertical-only one, each of which Pillow 13 still runs alone, and which the bundle's resize then matches."""
    run_py = load_run_py(bundle_dir / "run.py")
    h, w = 32, 32
    cfg = tmp_path / "bundle.cfg"
    cfg.write_text(f"input_height={h}\ninput_width={w}\nresize_mode=squash\ninterpolation=bicubic\n"
                   "resample_order=horizontal\nlabels=labels.txt\n")
    (tmp_path / "labels.txt").write_text("a\nb\n")
    files = test_images["png"]
    got = cpp_batch(classify_bin, files, tmp_path, cfg, h, w, 2)
    bicubic = Image.Resampling.BICUBIC
    for f, a in zip(files, got, strict=True):
        with Image.open(f) as im:
            src = run_py.to_rgb(im)
        mid = src.resize((w, src.height), bicubic) if src.width != w else src
        want = np.asarray(mid.resize((w, h), bicubic) if mid.height != h else mid)
        assert np.array_equal(a, want), f"{f.name}: {int((a != want).sum())} bytes differ"


def test_jpeg_within_2_levels_and_same_top1(bundle_dir: Path, classify_bin: Path, test_images: dict[str, list[Path]],
                                            tmp_path: Path) -> None:
    run_py = load_run_py(bundle_dir / "run.py")
    pp, spec, classes = bundle_facts(bundle_dir)
    h, w = pp["input_size"]
    files = test_images["jpg"]
    got = cpp_batch(classify_bin, files, tmp_path, bundle_dir / "cpp" / "bundle.cfg", h, w, classes)
    want = run_py_batch(run_py, files, pp, spec)
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= 2, f"max difference {diff.max()} levels"
    model = run_py.OrtModel(bundle_dir / json.loads((bundle_dir / "manifest.json").read_text())["bundle"]["default_model"])
    assert np.array_equal(model(got).argmax(1), model(want).argmax(1))


def test_example_prints_what_run_py_prints(bundle_dir: Path, classify_bin: Path, test_images: dict[str, list[Path]],
                                           tmp_path: Path) -> None:
    """Split above the profile max (6), pad below its min (3), skip bad files by name; same lines as run.py."""
    run_py = load_run_py(bundle_dir / "run.py")
    pp, spec, classes = bundle_facts(bundle_dir)
    h, w = pp["input_size"]
    man = json.loads((bundle_dir / "manifest.json").read_text())
    model = run_py.OrtModel(bundle_dir / man["bundle"]["default_model"])
    pngs = test_images["png"]
    x = run_py_batch(run_py, pngs, pp, spec)
    table = tmp_path / "table.bin"
    with table.open("wb") as fh:
        for img, z in zip(x, model(x), strict=True):
            fh.write(img.tobytes() + np.asarray(z, np.float32).tobytes())
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    args = [*map(str, pngs[:6]), str(tmp_path / "missing.png"), str(broken), *map(str, pngs[6:])]
    eng, dump = stub_engine(tmp_path, h, w, classes, lo=3, hi=6, table=table)
    for extra in ([], ["--json"]):
        r = subprocess.run([str(classify_bin), str(eng), *args, "--top", "3", "--batch", "8", *extra],
                           capture_output=True, text=True, timeout=300, cwd=bundle_dir)
        ref = subprocess.run([sys.executable, str(bundle_dir / "run.py"), *args, "--top", "3", "--backend", "onnxruntime", *extra],
                             capture_output=True, text=True, timeout=300, cwd=bundle_dir)
        assert r.returncode == ref.returncode == 3, (r.stderr, ref.stderr)
        skipped = [ln for ln in r.stderr.splitlines() if ln]
        assert len(skipped) == 2 and "missing.png" in skipped[0] and "broken.png" in skipped[1], r.stderr
        got, want = r.stdout.splitlines(), ref.stdout.splitlines()
        assert len(got) == len(want) == len(pngs)
        for g, e in zip(got, want, strict=True):
            if extra:
                gj, ej = json.loads(g), json.loads(e)
                assert (gj["path"], gj["label"], gj["index"]) == (ej["path"], ej["label"], ej["index"])
                assert [t["label"] for t in gj["top"]] == [t["label"] for t in ej["top"]]
                assert np.allclose([t["score"] for t in gj["top"]], [t["score"] for t in ej["top"]], atol=1e-4)
            else:
                gs, es = g.split("\t"), e.split("\t")
                assert gs[0::2] == es[0::2], (g, e)  # the path and the labels
                assert np.allclose([float(v) for v in gs[1::2]], [float(v) for v in es[1::2]], atol=1.5e-4), (g, e)
    calls = dumped(dump, h, w)  # chunks of min(--batch 8, max 6), the last padded up to min 3 (both runs alike)
    n_ok, step = len(pngs), 6
    assert n_ok % step and n_ok % step < 3, "the images must leave a short last chunk to pad"
    assert [len(c) for c in calls] == [step] * (n_ok // step) + [3]
    assert np.array_equal(np.concatenate(calls)[:n_ok], x)
    assert not calls[-1][n_ok % step:].any()  # the padding is zeros


def _one_error_line(r: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == code, (r.returncode, r.stderr)
    assert len(lines) == 1, r.stderr
    assert "terminate" not in r.stderr and "Aborted" not in r.stderr and "what()" not in r.stderr
    for wd in words:
        assert wd in lines[0], lines[0]


def test_bad_input_one_line_no_crash(bundle_dir: Path, classify_bin: Path, test_images: dict[str, list[Path]], tmp_path: Path) -> None:
    pp, _, classes = bundle_facts(bundle_dir)
    h, w = pp["input_size"]
    eng, _ = stub_engine(tmp_path, h, w, classes)
    img = str(test_images["png"][0])

    def run(*a: str, cwd: Path = bundle_dir) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(classify_bin), *a], capture_output=True, text=True, timeout=120, cwd=cwd)

    _one_error_line(run("--config", "cpp/bundle.cfg", str(tmp_path / "none.engine"), img), 1, "none.engine", "no such engine", "build_engine.sh")
    _one_error_line(run(str(eng), img, "--config", str(tmp_path / "nope.cfg")), 1, "nope.cfg", "vitdeploy bundle")
    _one_error_line(run(str(eng), img, cwd=tmp_path), 1, "bundle.cfg", "--config")  # none beside the engine or here
    _one_error_line(run("--bogus", str(eng), img), 2, "--bogus")
    _one_error_line(run("--top", "0", str(eng), img), 2, "--top")
    _one_error_line(run("--batch", "x", str(eng), img), 2, "--batch")
    _one_error_line(run(str(eng)), 2, "image")
    _one_error_line(run(), 2, "engine")
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_error_line(run("--config", "cpp/bundle.cfg", str(eng), str(empty)), 2, "no images")
    _one_error_line(run("--config", "cpp/bundle.cfg", str(eng), str(tmp_path / "gone.jpg")), 1, "gone.jpg")
    wrong, _ = stub_engine(tmp_path / "w", h + 1, w, classes)
    _one_error_line(run("--config", "cpp/bundle.cfg", str(wrong), img), 1, "another model")
    bad_cfg = tmp_path / "bad.cfg"
    bad_cfg.write_text("input_height=32\ninput_width=32\nresize_mode=shorter\ninterpolation=cubic\n")
    _one_error_line(run("--config", str(bad_cfg), str(eng), img), 1, "interpolation=cubic")


# ------------------------------------------------------------------------------------------- on a GPU


@pytest.mark.tensorrt
def test_example_on_the_engine_matches_run_py(bundle_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cmake-build the bundle's cpp/ against the installed TensorRT, run classify on the engine, compare with run.py."""
    from vitdeploy.stages.engine import BuildOptions, build_engine, probe

    missing = probe().missing
    if missing:
        pytest.skip(f"needs TensorRT and a CUDA GPU: {missing}")
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed")
    man = json.loads((bundle_dir / "manifest.json").read_text())
    default = man["bundle"]["default_model"]
    engine = bundle_dir / default.replace(".onnx", ".engine")  # where build_engine.sh puts it, run.py looks
    monkeypatch.chdir(bundle_dir)
    res = build_engine(default, BuildOptions(min_batch=2, opt_batch=4, max_batch=4))  # 11 images: split and pad
    if Path(res.engine).resolve() != engine.resolve():
        shutil.copyfile(res.engine, engine)
    build = tmp_path / "build"
    for cmd in (["cmake", "-S", str(bundle_dir / "cpp"), "-B", str(build)], ["cmake", "--build", str(build), "-j4"]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    images = [str(p) for p in sorted((bundle_dir / "reference" / "images").iterdir())]
    r = subprocess.run([str(build / "classify"), str(engine), *images, "--top", "3"], capture_output=True, text=True, timeout=300)
    ref = subprocess.run([sys.executable, str(bundle_dir / "run.py"), *images, "--top", "3", "--backend", "tensorrt"],
                         capture_output=True, text=True, timeout=300, cwd=bundle_dir)
    assert r.returncode == ref.returncode == 0, (r.stderr, ref.stderr)
    for g, e in zip(r.stdout.splitlines(), ref.stdout.splitlines(), strict=True):
        gs, es = g.split("\t"), e.split("\t")
        assert gs[0] == es[0] and gs[1] == es[1], (g, e)
        assert np.allclose([float(v) for v in gs[2::2]], [float(v) for v in es[2::2]], atol=2e-3)
    foreign = tmp_path / "foreign.engine"
    foreign.write_bytes(engine.read_bytes()[:64] + b"\0" * 4096)
    r = subprocess.run([str(build / "classify"), str(foreign), images[0]], capture_output=True, text=True, timeout=120)
    _one_error_line(r, 1, "cannot load this engine", "build_engine.sh")
