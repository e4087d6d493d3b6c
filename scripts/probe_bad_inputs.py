#!/usr/bin/env python3
"""Run every command with bad input and check the project's promises, as a new user would meet them.

    .venv/bin/python scripts/probe_bad_inputs.py            # every probe (a few minutes)
    .venv/bin/python scripts/probe_bad_inputs.py --fast     # the quick ones (CI: tests/test_probe.py)
    .venv/bin/python scripts/probe_bad_inputs.py --code DIR # the vitdeploy package of another checkout (e.g. an
                                                            # older commit in a git worktree), for before/after

Each probe runs `python -m vitdeploy ...` in its own process in a scratch folder of real files (a digits
checkpoint trained for one epoch, its ONNX export, real digit images, a broken and a decompression-bomb PNG) and
prints a row: command | input | exit | last line | traceback? | files changed. The promises checked:
- the documented exit code (0 done, 1 failed, 2 usage, 3 partly done);
- a failure is one line on stderr, without a traceback;
- nothing is written or changed outside the probe's own output (and never outside the scratch folder: the
  filesystem root is watched too), and a failure writes nothing at all.
Exit 1 when any promise is broken.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Probe:
    args: list[str]  # after `vitdeploy`; {w} is the scratch folder
    code: int  # the documented exit code
    what: str  # the bad input, in words
    outputs: list[str] = field(default_factory=list)  # paths (relative to the scratch folder) it may write
    slow: bool = False
    setup: str | None = None  # a named preparation run before the probe


def probes() -> list[Probe]:
    P = Probe
    return [
        # option values (items 11-13): exit 2, one line, before any work
        P(["infer", "img", "--workers", "-2"], 2, "negative --workers"),
        P(["infer", "img", "--threads", "-1"], 2, "negative --threads"),
        P(["infer", "img", "--top-k", "0"], 2, "--top-k 0"),
        P(["infer", "img", "--backend", "nosuch"], 2, "unknown backend"),
        P(["infer", "img", "--model", "model.onnx", "--backend", "torch"], 1, "an ONNX model on torch"),
        P(["infer", "img", "--model", "img"], 1, "a folder as the model"),
        P(["benchmark", "model.onnx", "--threads", "-2"], 2, "negative --threads"),
        P(["benchmark", "model.onnx", "--warmup", "-1"], 2, "negative --warmup"),
        P(["benchmark", "model.onnx", "--batch-sizes", "100000000"], 2, "a batch that cannot fit in memory"),
        P(["benchmark", "model.onnx", "--device", "cuda"], 2, "--device cuda without a GPU"),
        P(["benchmark", "--preset", "vit-gigantic"], 2, "unknown preset"),
        P(["verify", "model.onnx", "model.onnx", "--images", "img", "--tolerance", "-1"], 2, "negative --tolerance"),
        P(["verify", "model.onnx", "model.onnx", "--images", "img", "--json", "adir"], 2, "--json to a folder",
          setup="adir"),
        P(["calibrate", "model.onnx", "--images", "img", "--max-drop", "-1"], 2, "negative --max-drop"),
        P(["calibrate", "model.onnx", "--images", "img", "--num-images", "0"], 2, "--num-images 0"),
        P(["calibrate", "model.onnx", "--images", "img", "--batch-size", "1", "-o", "model.onnx"], 2, "output = input"),
        P(["calibrate", "model.onnx", "--images", "img", "--batch-size", "1", "-o", "x.txt"], 2,
          "an output that is not .onnx"),
        P(["calibrate", "model.onnx", "--target", "trt9"], 2, "unknown --target"),
        P(["convert-fp16", "model.onnx", "-o", "model.onnx"], 2, "output = input"),
        P(["convert-fp16", "model.onnx", "-o", "./sub/../model.onnx"], 2, "output = input, spelled otherwise"),
        P(["convert-fp16", "model.onnx", "-o", "link.onnx"], 2, "output = input through a symlink", setup="link"),
        P(["convert-fp16", "model.onnx", "-o", "x.txt"], 2, "an output that is not .onnx"),
        P(["export", "ckpt.pth", "--opset", "5"], 2, "--opset below 17"),
        P(["export", "ckpt.pth", "--target", "nosuch"], 2, "unknown --target"),
        P(["export", "img"], 1, "a folder as the checkpoint"),
        P(["import", "ckpt.pth", "-o", "ckpt.pth"], 2, "output = input (would drop train_state)"),
        P(["explain", "img/a.png", "--model", "model.onnx", "--top-k", "0"], 2, "--top-k 0"),
        P(["explain", "img/a.png", "--model", "model.onnx", "--discard-ratio", "1"], 2, "--discard-ratio 1"),
        P(["bundle", "model.onnx", "--references", "0"], 2, "--references 0"),
        P(["bundle", "model.onnx", "-o", "notes", "--force"], 2, "--force on a folder that is not a bundle",
          setup="notes"),
        P(["build-engine", "model.onnx", "--min-batch", "0"], 2, "--min-batch 0"),
        P(["build-engine", "model.onnx", "--workspace", "0"], 2, "--workspace 0"),
        P(["build-engine", "model.onnx", "--target", "trt7"], 2, "unknown --target"),
        P(["train", "--epochs", "0", "-o", "t.pth"], 2, "--epochs 0"),
        P(["train", "--epochs", "-1", "-o", "t.pth"], 2, "--epochs -1"),
        P(["train", "--batch-size", "-8", "-o", "t.pth"], 2, "negative --batch-size"),
        P(["train", "--val-fraction", "1.0", "-o", "t.pth"], 2, "--val-fraction 1.0"),
        P(["train", "--image-size", "0", "-o", "t.pth"], 2, "--image-size 0"),
        P(["train", "--lr", "-1", "-o", "t.pth"], 2, "negative --lr"),
        P(["train", "--label-smoothing", "2", "-o", "t.pth"], 2, "--label-smoothing 2"),
        P(["train", "--preset", "vit-gigantic", "-o", "t.pth"], 2, "unknown preset"),
        P(["train", "-o", "t.onnx", "--epochs", "1"], 2, "a checkpoint under an ONNX name"),
        P(["nosuch"], 2, "unknown command"),
        P(["infer"], 2, "a missing argument"),
        # unreadable images among good ones: rows for the good, the bad named, exit 3 (item 7)
        P(["infer", "mixed", "-o", "pred.csv"], 3, "a broken PNG and a decompression bomb among good images",
          outputs=["pred.csv"]),
        P(["verify", "model.onnx", "model.onnx", "--images", "mixed", "--json", "-"], 3,
          "--json - (stdout) and unreadable images"),
        # item 1: two inputs with one stem, by absolute path: the maps stay inside -o
        P(["explain", "{w}/img/a.png", "{w}/img/a.png", "{w}/img2/a.png", "--model", "model.onnx", "-o", "maps"], 0,
          "one image twice by absolute path", outputs=["maps"], slow=True),
        P(["calibrate", "model.onnx", "--images", "mixed", "-o", "m.int8.onnx", "--batch-size", "2"], 3,
          "unreadable calibration images", outputs=["m.int8.onnx", "m.int8.calib.json"], slow=True),
        P(["export", "ckpt.pth", "-o", "e.onnx", "--images", "mixed"], 3, "unreadable parity images",
          outputs=["e.onnx"], slow=True),
    ]


# ------------------------------------------------------------------ the scratch folder


def make_scratch(root: Path, code: Path) -> None:
    """A digits checkpoint (one epoch), its ONNX export, real digit images, a broken PNG and a decompression bomb."""
    import numpy as np
    from PIL import Image

    env = {**os.environ, "PYTHONPATH": str(code)}
    script = (
        "from pathlib import Path\n"
        "from vitdeploy.model.train import TrainOptions, train\n"
        "from vitdeploy.model.data import write_digits\n"
        f"r = Path({str(root)!r})\n"
        "train(None, TrainOptions(epochs=1, out=r / 'ckpt.pth', seed=0))\n"
        "write_digits(r / 'digits')\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env=env, capture_output=True, timeout=600)
    subprocess.run([sys.executable, "-m", "vitdeploy", "export", "ckpt.pth", "--no-check"], cwd=root, env=env,
                   check=True, capture_output=True, timeout=600)
    val = sorted((root / "digits" / "val").rglob("*.png"))
    for name in ("img", "img2", "mixed"):
        (root / name).mkdir()
    shutil.copy(val[0], root / "img" / "a.png")
    shutil.copy(val[1], root / "img2" / "a.png")
    for f in val[:6]:
        shutil.copy(f, root / "mixed" / f"{f.parent.name}_{f.name}")
    (root / "mixed" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    # a real PNG whose pixel count is over PIL's decompression-bomb limit (2 x MAX_IMAGE_PIXELS): it compresses small
    bomb = Image.fromarray(np.zeros((1, 1), np.uint8))
    bomb = bomb.resize((16000, 12000))
    bomb.save(root / "mixed" / "bomb.png")
    shutil.rmtree(root / "digits")


def pristine(root: Path) -> Path:
    return root.with_name(root.name + ".pristine")


def restore(root: Path) -> None:
    """Put the scratch folder back as make_scratch left it (a probe that broke a promise may have changed it)."""
    shutil.rmtree(root)
    shutil.copytree(pristine(root), root, symlinks=True)


def prepare(root: Path, what: str | None) -> None:
    if what == "adir":
        (root / "adir").mkdir(exist_ok=True)
    elif what == "link":
        link = root / "link.onnx"
        if not link.exists():
            link.symlink_to(root / "model.onnx")
    elif what == "notes":
        (root / "notes").mkdir(exist_ok=True)
        (root / "notes" / "mine.txt").write_text("a user's notes\n")


def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir():
            out[str(p.relative_to(root)) + "/"] = ""
    return out


def fs_root() -> set[str]:
    return {p.name for p in Path("/").iterdir()}


# ------------------------------------------------------------------ running


@dataclass
class Row:
    probe: Probe
    exit: int
    last: str
    traceback: bool
    changed: list[str]
    broken: list[str]


def run_probe(p: Probe, root: Path, code: Path, timeout: float) -> Row:
    prepare(root, p.setup)
    before, top = snapshot(root), fs_root()
    args = [a.replace("{w}", str(root)) for a in p.args]
    env = {**os.environ, "PYTHONPATH": str(code), "COLUMNS": "200"}
    try:
        r = subprocess.run([sys.executable, "-m", "vitdeploy", *args], cwd=root, env=env, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:  # still working after --timeout: the bad input was taken, not refused
        out = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        r = subprocess.CompletedProcess(e.cmd, -9, "", out + "\n(killed: still running after the probe's timeout)")
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    after = snapshot(root)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    outside_root = sorted(fs_root() - top)
    for name in outside_root:  # written to the filesystem root by a broken output-name builder: remove it
        target = Path("/") / name
        if target.is_file():
            target.unlink()
    allowed = [o.rstrip("/") for o in p.outputs]
    stray = [c for c in changed if not any(c.rstrip("/") == a or c.startswith(a + "/") for a in allowed)]
    broken = []
    if r.returncode != p.code:
        broken.append(f"exit {r.returncode}, documented {p.code}")
    if "Traceback" in r.stderr:
        broken.append("traceback")
    if r.returncode in (1, 2) and len(err) != 1:
        broken.append(f"{len(err)} lines on stderr")
    if r.returncode in (1, 2) and changed:
        broken.append("a failure changed files")
    elif stray:
        broken.append("files outside the output")
    if outside_root:
        broken.append(f"wrote to / ({', '.join(outside_root)[:60]})")
    if changed:  # the next probe starts from the same files
        restore(root)
    return Row(p, r.returncode, (err[-1] if err else "")[:90], "Traceback" in r.stderr, changed + outside_root, broken)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help="only the quick probes (CI)")
    ap.add_argument("--code", type=Path, default=REPO, help="the checkout whose vitdeploy package to probe")
    ap.add_argument("--keep", type=Path, help="keep the scratch folder here")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds a probe may run; one still running then took the bad input (e.g. trained)")
    a = ap.parse_args(argv)
    chosen = [p for p in probes() if not (a.fast and p.slow)]
    with tempfile.TemporaryDirectory(prefix="vitdeploy-probe-") as tmp:
        root = (Path(a.keep) if a.keep else Path(tmp)) / "work"
        root.mkdir(parents=True)
        make_scratch(root, a.code.resolve())
        shutil.copytree(root, pristine(root), symlinks=True)
        rows = [run_probe(p, root, a.code.resolve(), a.timeout) for p in chosen]
    w = 44
    print(f"{'command | input':{w}} | exit | want | tb | files changed | last line")
    for r in rows:
        cmd = f"{r.probe.args[0]} | {r.probe.what}"[:w]
        mark = "" if not r.broken else "   <-- " + "; ".join(r.broken)
        print(f"{cmd:{w}} | {r.exit:4} | {r.probe.code:4} | {'yes' if r.traceback else 'no ':3} | "
              f"{', '.join(r.changed)[:30]:30} | {r.last}{mark}")
    bad = [r for r in rows if r.broken]
    print(f"\n{len(rows)} probes, {len(bad)} broke a promise")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
