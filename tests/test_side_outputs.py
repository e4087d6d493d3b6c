"""Every file a command writes is an output (issue 40, B): the files written beside -o (caches, sidecars, file
lists, a best-so-far checkpoint, external weights, a raw-pixel variant) go through the one output check -o goes
through, and no write follows a link at its destination.

The first tests read vitdeploy's code: every function that writes a file is declared in core/outputs.py's WRITERS,
and every side output it declares has a behavioural case here, so a new sidecar cannot skip the check unnoticed.
"""

from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_cases import CliCase, run_cli_cases

from vitdeploy.core.errors import UsageError
from vitdeploy.core.fileio import atomic_path, move_into, temp_dir_beside, write_text_atomic
from vitdeploy.core.outputs import MAIN, SIDE_OUTPUTS, TEMP, WRITERS, check_side_outputs, side_output_path

REPO = Path(__file__).resolve().parents[1]

# --- the code: every writer declared ------------------------------------------------------------------------------

_WRITE_FUNCS = {"atomic_path", "write_text_atomic", "write_json_atomic", "temp_dir_beside", "move_into"}
_WRITE_ATTRS = {"save", "savez", "savez_compressed", "save_model", "write_table", "write_text", "write_bytes", "tofile", "export",
                "copyfile", "copy2", "copytree", "copymode", "symlink_to", "hardlink_to", "link", "symlink", "mknod"}


def _mode_writes(args: list[ast.expr], keywords: list[ast.keyword]) -> bool:
    """An open() mode that writes: a constant holding w, a, x or +; a mode that is not a constant counts as one."""
    modes = [k.value for k in keywords if k.arg == "mode"] + args
    return any(not isinstance(m, ast.Constant) or (isinstance(m.value, str) and set(m.value) & set("wax+"))
               for m in modes)


def _writes(call: ast.Call) -> bool:
    """Whether a call writes a file (by name: the primitives of core/fileio and the libraries' savers)."""
    f = call.func
    if isinstance(f, ast.Name):
        return f.id in _WRITE_FUNCS or (f.id == "open" and _mode_writes(call.args[1:2], call.keywords))
    if not isinstance(f, ast.Attribute):
        return False
    owner = f.value.id if isinstance(f.value, ast.Name) else None
    if f.attr in ("replace", "rename"):  # str.replace is no write; os.replace / os.rename / Path.rename are
        return owner == "os" or f.attr == "rename"
    if f.attr == "copy":  # ndarray.copy() is no write; shutil.copy is
        return owner == "shutil"
    if f.attr == "open":
        if owner == "os":  # os.open with a write flag
            return any(isinstance(n, ast.Attribute) and n.attr in ("O_WRONLY", "O_RDWR", "O_CREAT")
                       for a in call.args for n in ast.walk(a))
        modes = [k.value for k in call.keywords if k.arg == "mode"] + call.args[:1]  # Path.open(mode); X.open(path)
        return any(isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax+")
                   for m in modes)
    return f.attr in _WRITE_ATTRS


def writers_in_code() -> dict[str, list[int]]:
    """Every function of vitdeploy that writes a file ("module:Class.function" → the lines), by reading the code.
    core/fileio.py is the primitives themselves; bundle_files/ (run.py, the C++ example) keep their own rule."""
    found: dict[str, list[int]] = {}
    for path in sorted((REPO / "vitdeploy").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if "/bundle_files/" in rel or rel == "vitdeploy/core/fileio.py":
            continue
        module = rel[: -len(".py")].replace("/", ".")

        def visit(node: ast.AST, stack: list[str]) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    visit(child, [*stack, child.name])
                    continue
                if isinstance(child, ast.Call) and _writes(child):
                    found.setdefault(f"{module}:{'.'.join(stack) or '<module>'}", []).append(child.lineno)  # noqa: B023
                visit(child, stack)

        visit(ast.parse(path.read_text(encoding="utf-8")), [])
    return found


def test_every_function_that_writes_a_file_is_declared_with_what_it_writes() -> None:
    found = writers_in_code()
    undeclared = {k: v for k, v in found.items() if k not in WRITERS}
    assert not undeclared, ("write calls in functions core/outputs.py's WRITERS does not declare (add each, with the "
                            f"outputs it writes, and check its side outputs before any work): {undeclared}")
    stale = sorted(set(WRITERS) - set(found))
    assert not stale, f"WRITERS declares functions that write nothing (any more): {stale}"


def test_every_declared_output_is_an_options_output_a_temporary_file_or_a_side_output() -> None:
    unknown = {k: [w for w in v if w not in (MAIN, TEMP, *SIDE_OUTPUTS)] for k, v in WRITERS.items()}
    assert not {k: v for k, v in unknown.items() if v}
    written = {w for v in WRITERS.values() for w in v}
    assert set(SIDE_OUTPUTS) <= written, f"side outputs no writer declares: {set(SIDE_OUTPUTS) - written}"


def test_the_scan_sees_each_way_of_writing_a_file() -> None:
    """The scanner itself: each way of writing a file is seen (a scan that saw nothing would pass the test above)."""
    for src in ('open(p, "w")', "np.save(p, x)", "p.write_text('x')", "shutil.copyfile(a, p)", "os.replace(a, p)",
                "write_json_atomic(p, {})", "torch.save(x, p)", 'p.open("a")', "os.open(p, os.O_WRONLY | os.O_CREAT)"):
        assert _writes(ast.parse(src, mode="eval").body), src  # type: ignore[arg-type]
    for src in ('open(p)', 'open(p, "rb")', "x.copy()", "s.replace('a', 'b')", "os.open(p, os.O_RDONLY)"):
        assert not _writes(ast.parse(src, mode="eval").body), src  # type: ignore[arg-type]


# --- the rule: atomic_path and move_into never write through a link ------------------------------------------------


def test_a_link_at_the_destination_is_replaced_and_its_target_keeps_its_bytes(tmp_path: Path) -> None:
    victim = tmp_path / "dinov2.pth"
    victim.write_bytes(b"weights")
    link = tmp_path / "p.pth.features.npz"
    link.symlink_to(victim)
    with atomic_path(link) as tmp, open(tmp, "wb") as f:
        np.savez(f, x=np.zeros(3))
    assert victim.read_bytes() == b"weights"
    assert not link.is_symlink() and np.load(link)["x"].shape == (3,)
    hard = tmp_path / "c.calib.json"
    os.link(victim, hard)
    write_text_atomic(hard, "{}\n")
    assert victim.read_bytes() == b"weights" and hard.read_text() == "{}\n"
    dangling = tmp_path / "gone.json"
    dangling.symlink_to(tmp_path / "nowhere" / "x.json")
    write_text_atomic(dangling, "{}\n")
    assert not dangling.is_symlink() and not (tmp_path / "nowhere").exists()


def test_a_folder_output_replaces_links_inside_it_and_writes_nothing_into_their_targets(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    (inputs / "sub").mkdir(parents=True)
    (inputs / "a.png").write_bytes(b"image")
    (inputs / "sub" / "b.png").write_bytes(b"image b")
    out = tmp_path / "maps"
    out.mkdir()
    (out / "a.png").symlink_to(inputs / "a.png")
    (out / "sub").symlink_to(inputs / "sub")
    staged = temp_dir_beside(out)
    (staged / "sub").mkdir()
    (staged / "a.png").write_bytes(b"map a")
    (staged / "sub" / "b.png").write_bytes(b"map b")
    move_into(staged, out)
    assert (inputs / "a.png").read_bytes() == b"image" and (inputs / "sub" / "b.png").read_bytes() == b"image b"
    assert (out / "a.png").read_bytes() == b"map a" and (out / "sub" / "b.png").read_bytes() == b"map b"
    assert not (out / "sub").is_symlink()
    linked = tmp_path / "linked"
    linked.symlink_to(inputs)  # the output folder itself a link to an input folder
    staged = temp_dir_beside(linked)
    (staged / "a.png").write_bytes(b"map")
    move_into(staged, linked)
    assert (inputs / "a.png").read_bytes() == b"image" and not linked.is_symlink()


def test_check_side_outputs_refuses_a_link_to_an_input_in_one_line(tmp_path: Path) -> None:
    victim = tmp_path / "model.onnx"
    victim.write_bytes(b"model")
    out = tmp_path / "c.onnx"
    side_output_path("calibration cache", out).symlink_to(victim)
    with pytest.raises(UsageError) as e:
        check_side_outputs(out, ["calibration cache"], [victim])
    text = str(e.value)
    assert "c.calib.json" in text and "is the input" in text and "model.onnx" in text and "\n" not in text
    check_side_outputs(tmp_path / "d.onnx", list(SIDE_OUTPUTS), [victim])  # nothing in the way: no refusal


# --- each side output, through its command ------------------------------------------------------------------------

# the command that writes each side output, with the input a link there points at; -o is OUT (a name per case)
SIDE_CASES: dict[str, tuple[list[str], str, str]] = {
    "features cache": (["train", "data", "--init", "ckpt.pth", "--probe", "knn", "-o"], ".pth", "ckpt.pth"),
    "partial checkpoint": (["train", "data", "--resume", "ckpt.pth", "--epochs", "2", "-o"], ".pth", "ckpt.pth"),
    "calibration cache": (["calibrate", "model.onnx", "-i", "data/0", "-o"], ".onnx", "model.onnx"),
    "external data": (["export", "ckpt.pth", "--no-check", "-o"], ".onnx", "ckpt.pth"),
    "raw variant": (["export", "ckpt.pth", "--no-check", "--embed-preprocess", "-o"], ".onnx", "ckpt.pth"),
    "engine sidecar": (["build-engine", "model.onnx", "-o"], ".engine", "model.onnx"),
    "rejected engine": (["build-engine", "model.onnx", "-o"], ".engine", "model.onnx"),
    "rejected engine sidecar": (["build-engine", "model.onnx", "-o"], ".engine", "model.onnx"),
    "files list": (["infer", "data/0", "--model", "model.onnx", "-o"], ".npy", "model.onnx"),
    "gallery record": (["index", "emb.npy", "--model", "model.onnx", "-o"], ".faiss", "model.onnx"),
    "gallery ids": (["index", "emb.npy", "--model", "model.onnx", "-o"], ".faiss", "model.onnx"),
}
LINKS = ("symlink", "hardlink")


def test_every_side_output_has_a_case_through_its_command() -> None:
    assert set(SIDE_CASES) == set(SIDE_OUTPUTS)


def _case_out(kind: str, link: str, ext: str) -> str:
    return f"{kind.replace(' ', '_')}-{link}{ext}"


@pytest.fixture(scope="module")
def side_refusals(digits_ckpt: Path, digits_onnx: Path, digits_folder: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[tuple[str, str], CliCase]]:
    """Each side output of SIDE_CASES made a symlink, then a hard link, to an input, and its command run (one
    process for all), in a folder whose files are compared before and after."""
    d = tmp_path_factory.mktemp("side")
    shutil.copy(digits_ckpt, d / "ckpt.pth")
    shutil.copy(digits_onnx, d / "model.onnx")
    for cls in [str(c) for c in range(10)]:  # the digits classes: --resume ckpt.pth fits them
        (d / "data" / cls).mkdir(parents=True)
        for p in sorted((digits_folder / "val" / cls).glob("*.png"))[:1]:
            shutil.copy(p, d / "data" / cls / p.name)
    np.save(d / "emb.npy", np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32))  # index's input
    argvs, keys = [], []
    for kind, (argv, ext, victim) in SIDE_CASES.items():
        for link in LINKS:
            out = _case_out(kind, link, ext)
            side = d / side_output_path(kind, out)
            if link == "symlink":
                side.symlink_to(victim)
            else:
                os.link(d / victim, side)
            argvs.append([*argv, out])
            keys.append((kind, link))
    argvs.append(["build-engine", "model.onnx", "--timing-cache", "model.onnx"])  # read, then written over
    keys.append(("timing cache", "the model"))
    before = {p: (d / p).read_bytes() for p in ("ckpt.pth", "model.onnx")}
    rows = run_cli_cases(argvs, d)
    assert {p: (d / p).read_bytes() for p in before} == before  # every input intact, byte for byte
    return d, dict(zip(keys, rows, strict=True))


# slow: the refusal cases share one fixture that runs every command once per link (about 20 CLI processes, 10-30 s);
# `make test` keeps the code scan above, which fails on a writer that skips the check, and CI runs these
@pytest.mark.slow
@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("kind", list(SIDE_CASES))
def test_a_side_output_that_is_a_link_to_an_input_is_refused_before_any_work(
        side_refusals: tuple[Path, dict[tuple[str, str], CliCase]], kind: str, link: str) -> None:
    d, rows = side_refusals
    r = rows[(kind, link)]
    side = side_output_path(kind, _case_out(kind, link, SIDE_CASES[kind][1])).name
    assert r.code == 2, (r.code, r.stderr)  # the project's convention for a refused output: usage, before any work
    assert len(r.lines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert side in r.stderr and "is the input" in r.stderr and SIDE_CASES[kind][2] in r.stderr, r.stderr
    assert r.changed == [], r.changed  # nothing written, the link left as it was


@pytest.mark.slow
def test_a_timing_cache_that_is_the_model_is_refused_before_any_work(
        side_refusals: tuple[Path, dict[tuple[str, str], CliCase]]) -> None:
    """build-engine reads --timing-cache and writes the updated cache over it: naming the model there would replace
    the model with a timing cache."""
    r = side_refusals[1][("timing cache", "the model")]
    assert r.code == 2 and len(r.lines()) == 1 and "--timing-cache model.onnx is the input" in r.stderr, r.stderr
    assert r.changed == []  # and the model intact: side_refusals compares the inputs byte for byte
