"""The device side is one contract (issue 31): the engine build_engine.sh writes is the engine run.py checks and runs;
a bundle reads and writes only itself; run.py hashes what it runs, counts labels as labels.txt holds them, streams
images, needs Pillow only to read images and prints names inert.

build_engine.sh runs for real (bash) with a stand-in trtexec that writes the --saveEngine file in the format
tests/trt_mock.py's runtime loads (the ONNX it was given, the profile); run.py then runs that engine on the mock
TensorRT of that version (which executes the ONNX with ONNX Runtime) or, without a tensorrt module, must say so in
one line. No TensorRT exists here: what is proved is the names and the messages, never TensorRT's numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import HostCuda, load_run_py
from PIL import Image
from trt_mock import fake_tensorrt

from vitdeploy.core.errors import UnreadableArtifact, VitdeployError

BUNDLE_FILES = Path(__file__).resolve().parents[1] / "vitdeploy" / "stages" / "bundle_files"
# one version per TensorRT line of the matrix (8.5, 8.6, 9/10, 11), as the mock has them
VERSIONS = {"trt8.5": "8.5.2.2", "trt8.6": "8.6.1", "trt10": "10.3.0", "trt11": "11.4.0.106"}


def fake_trtexec(bindir: Path) -> Path:
    """A trtexec stand-in: logs its argv, writes --saveEngine as tests/trt_mock.py's plan (version from TRT_FAKE)."""
    bindir.mkdir(parents=True, exist_ok=True)
    script = bindir / "trtexec"
    script.write_text(f"""#!{sys.executable}
import json, os, sys
argv = sys.argv[1:]
if argv[:1] == ["--help"]:
    sys.exit(0)
opt = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
def shape(s):
    name, dims = s.rsplit(":", 1)
    return name, [int(d) for d in dims.split("x")]
name, lo = shape(opt["minShapes"]); _, mid = shape(opt["optShapes"]); _, hi = shape(opt["maxShapes"])
plan = {{"version": os.environ["TRT_FAKE"], "onnx": os.path.abspath(opt["onnx"]),
         "dla_core": int(opt["useDLACore"]) if "useDLACore" in opt else None, "profile": [name, lo, mid, hi]}}
with open(opt["saveEngine"], "w") as f:
    json.dump(plan, f)
""")
    script.chmod(0o755)
    return script


def build_engine(bundle: Path, bindir: Path, version: str, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "TRT_FAKE": version}
    return subprocess.run(["bash", str(bundle / "build_engine.sh"), "--trt", version, *args], capture_output=True,
                          text=True, env=env, timeout=60, cwd=bundle)


def run_py_process(bundle: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # run.py imports no vitdeploy
    return subprocess.run([sys.executable, str(bundle / "run.py"), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=bundle.parent)


def ended(fn, capsys: pytest.CaptureFixture) -> tuple[int, list[str], str]:  # noqa: ANN001
    try:
        code, msg = fn(), None
    except SystemExit as e:
        code, msg = (e.code, None) if isinstance(e.code, int) or e.code is None else (1, str(e.code))
    out = capsys.readouterr()
    return int(code or 0), out.err.splitlines() + ([msg] if msg else []), out.out


def one_line(err: list[str]) -> str:
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


@pytest.fixture
def bundle_copy(digits_bundle: Path, tmp_path: Path) -> Path:
    b = tmp_path / "bundle"
    shutil.copytree(digits_bundle, b)
    return b


# --- 1. the engine build_engine.sh writes is the engine run.py checks, on every TensorRT line ----------------------


@pytest.mark.parametrize("line", list(VERSIONS))
def test_run_py_checks_the_engine_build_engine_sh_wrote_on_every_tensorrt_line(
        bundle_copy: Path, tmp_path: Path, line: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    b, version = bundle_copy, VERSIONS[line]
    man = json.loads((b / "manifest.json").read_text())
    assert man.get("target") is None  # a no-target bundle: the lines build variants of their own
    fake_trtexec(tmp_path / "bin")
    r = build_engine(b, tmp_path / "bin", version)
    assert r.returncode == 0, r.stderr
    wrote = next(ln.split(" ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("wrote "))
    entry = man["bundle"]["tensorrt"]["engines"][line][man["bundle"]["default_model"]]
    assert wrote == entry["engine"] and (b / wrote).is_file()  # the script's name is the manifest entry's
    # no TensorRT module here (the venv's `tensorrt` is a bindings-less namespace): one line naming that engine
    p = run_py_process(b, "--check")
    assert p.returncode == 1 and p.stdout == "", p.stdout
    msg = one_line(p.stderr.splitlines())
    assert wrote in msg and "TensorRT's Python module is not installed" in msg and "--backend onnxruntime" in msg
    # with TensorRT of that version (the mock: it runs the ONNX the plan names), --check runs and names that engine
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(version))
    mod = load_run_py(b / "run.py")
    monkeypatch.setattr(mod, "CudaRT", HostCuda)
    code, err, out = ended(lambda: mod.main(["--check"]), capsys)
    assert code == 0 and out.startswith(f"OK: {wrote} (built from {entry['onnx']}) on tensorrt"), (err, out)
    code, err, out = ended(lambda: mod.main(["--check", "--json"]), capsys)
    res = json.loads(out)
    assert res["engine"] == wrote and res["backend"] == "tensorrt" and res["model"] == entry["onnx"] and res["ok"]
    images = str(b / "reference" / "images")  # run.py IMAGES uses the engine too
    calls: list = []
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(version, calls))
    code, err, out = ended(lambda: mod.main([images, "--json"]), capsys)
    assert code == 0 and len(out.splitlines()) == 12 and any(c[0] == "deserialize" for c in calls), err


def test_with_engines_of_two_lines_run_py_takes_its_tensorrts_and_without_tensorrt_names_both(
        bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    b = bundle_copy
    fake_trtexec(tmp_path / "bin")
    names = {}
    for line in ("trt8.5", "trt10"):
        r = build_engine(b, tmp_path / "bin", VERSIONS[line])
        assert r.returncode == 0, r.stderr
        names[line] = next(ln.split(" ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("wrote "))
    assert names["trt8.5"] != names["trt10"]
    mod = load_run_py(b / "run.py")
    monkeypatch.setattr(mod, "CudaRT", HostCuda)
    for line in ("trt8.5", "trt10"):
        monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(VERSIONS[line]))
        code, err, out = ended(lambda: mod.main(["--check", "--json"]), capsys)
        assert code == 0 and json.loads(out)["engine"] == names[line], err
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError
    code, err, out = ended(lambda: mod.main(["--check"]), capsys)
    line1 = one_line(err)
    assert code == 1 and out == "" and names["trt8.5"] in line1 and names["trt10"] in line1
    code, err, out = ended(lambda: mod.main(["--check", "--backend", "onnxruntime"]), capsys)
    assert code == 0 and out.startswith("OK: model.int8.raw.onnx on onnxruntime"), err  # asked for: the ONNX


# --- 4. run.py hashes and runs the same file ---------------------------------------------------------------------


def test_run_py_refuses_a_model_outside_the_bundle_and_runs_the_bytes_it_hashed(
        bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    b = bundle_copy
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(b / "model.raw.onnx", other / "model.int8.raw.onnx")  # another model under the bundle's name
    mod = load_run_py(b / "run.py")
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    for given in ("../other/model.int8.raw.onnx", str(other / "model.int8.raw.onnx")):
        code, err, out = ended(lambda g=given: mod.main(["--model", g, "--check"]), capsys)
        assert code == 2 and "not a file of this bundle" in err[0] and out == "", (err, out)
    seen: list[bytes] = []
    real = mod.OrtModel.__init__

    def spy(self, path: Path, data: bytes | None = None) -> None:  # noqa: ANN001
        seen.append(data)  # type: ignore[arg-type]
        real(self, path, data)

    monkeypatch.setattr(mod.OrtModel, "__init__", spy)
    code, err, out = ended(lambda: mod.main(["--check"]), capsys)
    import hashlib

    want = json.loads((b / "manifest.json").read_text())["bundle"]["artifacts"]["model.int8.raw.onnx"]["sha256"]
    assert code == 0 and len(seen) == 1 and seen[0] is not None and hashlib.sha256(seen[0]).hexdigest() == want


# --- 5. build_engine.sh writes nothing through a symlink -------------------------------------------------------


@pytest.mark.parametrize("planted", ["dla", "engine", "timing.cache"])
def test_build_engine_sh_writes_nothing_through_a_symlink(bundle_copy: Path, tmp_path: Path, planted: str) -> None:
    b = bundle_copy
    fake_trtexec(tmp_path / "bin")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    engine = json.loads((b / "manifest.json").read_text())["bundle"]["tensorrt"]["engines"]["trt10"][
        "model.int8.raw.onnx"]["engine"]
    link = {"dla": f"{engine}.dla", "engine": engine, "timing.cache": "timing.cache"}[planted]
    os.symlink(victim, b / link)
    r = build_engine(b, tmp_path / "bin", "10.3.0", "--dla", "0")
    assert r.returncode == 1 and "symlink" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert victim.read_text() == "precious\n" and (b / link).is_symlink()
    os.unlink(b / link)
    r = build_engine(b, tmp_path / "bin", "10.3.0", "--dla", "0")
    assert r.returncode == 0 and (b / f"{engine}.dla").read_text() == "0\n" and not list(b.glob("*.engine.*.*"))


# --- 6. a bundle reads only itself: run.py, vitdeploy info and build_engine.sh, one rule -------------------------


def _plant(b: Path, entry: str) -> str:
    """Make manifest.json list ``entry`` as one of its artifacts (a FIFO is made for "fifo")."""
    if entry == "fifo":
        os.mkfifo(b / "fifo")
    man = json.loads((b / "manifest.json").read_text())
    man["bundle"]["artifacts"][entry] = {"precision": "int8", "sha256": "0" * 64}
    (b / "manifest.json").write_text(json.dumps(man))
    return entry


@pytest.mark.parametrize("entry", ["/usr", "../x", "fifo", "/dev/zero", "reference"])
def test_a_manifest_entry_outside_the_bundle_or_not_a_file_is_one_line_fast(
        bundle_copy: Path, entry: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    b = bundle_copy
    (b.parent / "x").write_bytes(b"outside")
    _plant(b, entry)
    p = run_py_process(b, "--check", "--backend", "onnxruntime", timeout=30)  # a hang fails here, not for ever
    msg = one_line(p.stderr.splitlines())
    assert p.returncode == 1 and repr(entry) in msg and "copy the bundle again" in msg, msg
    from vitdeploy.tools.info import info

    t = time.perf_counter()
    with pytest.raises(UnreadableArtifact) as e:
        info(b)
    assert time.perf_counter() - t < 2.0 and repr(entry) in str(e.value) and "\n" not in str(e.value)
    mod = load_run_py(b / "run.py")  # the same rule, in-process: well under 2 s (FIFO: refused by type, never opened)
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    t = time.perf_counter()
    code, err, _ = ended(lambda: mod.main(["--check", "--backend", "onnxruntime"]), capsys)
    assert time.perf_counter() - t < 2.0 and code == 1
    assert one_line(err) == f"error: {e.value}".replace(f"{b}: ", "")  # the same words as vitdeploy info


def test_the_cli_info_on_a_bundle_listing_usr_is_one_line(bundle_copy: Path) -> None:
    _plant(bundle_copy, "/usr")
    venv_bin = Path(sys.executable).parent
    t = time.perf_counter()
    r = subprocess.run([str(venv_bin / "vitdeploy"), "info", str(bundle_copy)], capture_output=True, text=True,
                       timeout=60)
    took = time.perf_counter() - t
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "'/usr'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and took < 30  # the work is < 2 s (above); this bounds a read of /usr


@pytest.mark.parametrize("case", ["absolute", "dotdot", "fifo", "symlink-out"])
def test_build_engine_sh_reads_only_its_own_regular_files(bundle_copy: Path, tmp_path: Path, case: str) -> None:
    b = bundle_copy
    text = (b / "build_engine.sh").read_text()
    entry = json.loads((b / "manifest.json").read_text())["bundle"]["tensorrt"]["engines"]["trt10"][
        "model.int8.raw.onnx"]
    onnx_name = entry["onnx"]
    if case == "absolute":
        text = text.replace(f" {onnx_name} ", " /etc/hostname ", 1)
    elif case == "dotdot":
        text = text.replace(f" {onnx_name} ", " ../x.onnx ", 1)
    elif case == "fifo":
        (b / onnx_name).unlink()
        os.mkfifo(b / onnx_name)
    else:
        (tmp_path / "out.onnx").write_bytes(b"x")
        (b / onnx_name).unlink()
        os.symlink(tmp_path / "out.onnx", b / onnx_name)
    (b / "build_engine.sh").write_text(text)
    fake_trtexec(tmp_path / "bin")
    r = build_engine(b, tmp_path / "bin", "10.3.0")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "bundle" in r.stderr, r.stderr
    assert not (b / entry["engine"]).exists()


# --- 9. labels: counted as labels.txt holds them; labels.txt written only from labels it can hold ------------------

BREAKERS = ["\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def test_run_py_counts_labels_txt_by_newline_only_and_prints_labels_inert(
        bundle_copy: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    b = bundle_copy
    man = json.loads((b / "manifest.json").read_text())
    labels = [f"c{i}{BREAKERS[i % len(BREAKERS)]}x" for i in range(len(man["labels"]))]
    labels[0] = "\x1b[2Jwiped"
    man["labels"] = labels
    (b / "manifest.json").write_text(json.dumps(man))
    (b / "labels.txt").write_text("".join(f"{lab}\n" for lab in labels), newline="")  # as another writer could
    mod = load_run_py(b / "run.py")
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    code, err, out = ended(lambda: mod.main([str(b / "reference" / "images"), "--top", "3", "--backend", "onnxruntime"]),
                           capsys)
    assert code == 0, err
    rows = out.split("\n")[:-1]
    assert len(rows) == 12 and all(r.isprintable() or "\t" in r for r in rows)
    assert not any(ch in out for ch in ["\x1b", *BREAKERS])
    assert "\\x1b[2Jwiped" in out or "\\u2028" in out or "\\r" in out


@pytest.mark.parametrize("ch", BREAKERS + ["\x1b", "\x00"])
def test_labels_txt_refuses_a_label_it_cannot_hold_on_one_line(ch: str) -> None:
    from vitdeploy.stages.bundle_configs import labels_file

    with pytest.raises(VitdeployError) as e:
        labels_file(["cat", f"do{ch}g"])
    assert "\n" not in str(e.value) and ch not in str(e.value) and "do" in str(e.value)
    assert labels_file(["cat", "dög", "猫", "a b\tc"]) == "cat\ndög\n猫\na b\tc\n"


# --- 12a. run.py streams: a batch is decoded, run, printed, then the next -----------------------------------------


def test_run_py_decodes_one_batch_before_the_first_model_call(bundle_copy: Path, capsys: pytest.CaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    b = bundle_copy
    mod = load_run_py(b / "run.py")
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    events: list[str] = []
    real_load, real_call = mod.load_resized, mod.OrtModel.__call__
    monkeypatch.setattr(mod, "load_resized", lambda f, pp: (events.append("decode"), real_load(f, pp))[1])
    monkeypatch.setattr(mod.OrtModel, "__call__", lambda self, x: (events.append(f"run{len(x)}"), real_call(self, x))[1])
    code, err, out = ended(lambda: mod.main([str(b / "reference" / "images"), "--batch", "4"]), capsys)
    assert code == 0 and len(out.splitlines()) == 12, err
    assert events[:5] == ["decode"] * 4 + ["run4"] and events.count("run4") == 3  # never all 12 held at once


# --- 14. run.py without Pillow: --help and --check work, reading images says what to install --------------------


def test_run_py_without_pillow(bundle_copy: Path, tmp_path: Path) -> None:
    block = tmp_path / "nopil"
    (block / "PIL").mkdir(parents=True)
    (block / "PIL" / "__init__.py").write_text("raise ImportError('No module named PIL')\n")
    env = {**os.environ, "PYTHONPATH": str(block), "OMP_NUM_THREADS": "1"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(bundle_copy / "run.py"), *args], capture_output=True, text=True,
                              env=env, timeout=120)

    r = run("--help")
    assert r.returncode == 0 and "--check" in r.stdout and not r.stderr
    r = run("--check", "--backend", "onnxruntime")
    assert r.returncode == 0 and r.stdout.startswith("OK: "), r.stderr
    r = run(str(bundle_copy / "reference" / "images"), "--backend", "onnxruntime")
    assert r.returncode == 1 and "Pillow" in one_line(r.stderr.splitlines()) and "pip install pillow" in r.stderr


# --- printing: a file name with control characters is printed escaped -------------------------------------------


def test_run_py_prints_a_hostile_file_name_escaped(bundle_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "imgs"
    d.mkdir()
    Image.fromarray(np.full((8, 8, 3), 128, np.uint8)).save(d / "a\x1b[2Jb\u2028c.png")
    (d / "bad\rname.png").write_bytes(b"not an image")
    mod = load_run_py(bundle_copy / "run.py")
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    code, err, out = ended(lambda: mod.main([str(d), "--backend", "onnxruntime"]), capsys)
    assert code == 3 and "\\x1b[2Jb\\u2028c.png" in out and "\x1b" not in out and "\u2028" not in out
    assert len(err) == 1 and "bad\\rname.png" in err[0] and "\r" not in err[0]


# --- run.py and receipt.py parse as Python 3.8 (JetPack 5) ---------------------------------------------------------


@pytest.mark.parametrize("path", [BUNDLE_FILES / "run.py",
                                  BUNDLE_FILES.parents[1] / "runners" / "tensorrt" / "inspector.py"])
def test_bundle_python_parses_as_python_3_8(path: Path) -> None:
    import ast

    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))
