#!/usr/bin/env python3
"""Run every command with bad input and check the project's promises, as a new user would meet them.

    .venv/bin/python scripts/probe_bad_inputs.py            # every probe (a few minutes)
    .venv/bin/python scripts/probe_bad_inputs.py --fast     # the quick ones (CI: tests/test_probe.py)
    .venv/bin/python scripts/probe_bad_inputs.py --code DIR # the vitdeploy package of another checkout (e.g. an
                                                            # older commit in a git worktree), for before/after
    .venv/bin/python scripts/probe_bad_inputs.py --fast --shard 0/3 --ckpt ckpt.pth --scratch DIR
        # the probes k with k % 3 == 0, on a trained digits checkpoint (not one trained here), in a scratch folder
        # made once in DIR for all the shards (tests/test_probe.py: one test per shard, spread by pytest-xdist)

Each probe runs `python -m vitdeploy ...` (or a bundle's run.py) in its own process in a scratch folder of real files
(a digits checkpoint trained for one epoch, its ONNX export, real digit images, a broken and a decompression-bomb PNG;
for issue 37 a small Hugging Face ViT saved by transformers' save_pretrained and a timm ViT saved by save_for_hf, which
each hostile-folder probe copies and edits one field of, and a -t cpu bundle of the checkpoint) and prints a row:
command | input | exit | last line | traceback? | files changed. What is probed: every command's options and
outputs; unreadable, special (FIFO, device) and NaN inputs; issue 31's labels, lineage and device side; issue 37's
import surface (config.json fields zero, strings, null, lists, Infinity, 100000 deep; preprocessor sizes; id2label;
shard indexes naming files outside the folder; an output inside the input folder; --labels /dev/zero and a FIFO;
--image-size 10^30), bundle's checks before work, and run.py's reads (a FIFO image, a deep manifest.json, --batch
10^9). The promises checked:
- the documented exit code (0 done, 1 failed, 2 usage, 3 partly done);
- a failure is one line on stderr, without a traceback;
- nothing is written or changed outside the probe's own output (and never outside the scratch folder: the
  filesystem root is watched too), and a failure writes nothing at all.
Exit 1 when any promise is broken.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
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
    check: str | None = None  # a named promise checked after the run (CHECKS), beyond exit code and files
    umask: int | None = None  # run under this umask
    timeout: float | None = None  # seconds before the probe counts as "still running" (default: --timeout)
    signal_after: tuple[int, float] | None = None  # (signal, seconds after the workers started): Ctrl-C, a kill
    hook: str | None = None  # HOOKS: another program acting while the command runs (issue 31: a source replaced)
    others: list[str] = field(default_factory=list)  # paths that other program changes (not the command's doing)
    program: str | None = None  # a script in the scratch folder run instead of `-m vitdeploy` (a bundle's run.py)
    memory_gib: float | None = None  # an address-space limit (RLIMIT_AS): an input read without a bound fails
    # there (MemoryError, a broken promise) instead of filling the machine's memory

    @property
    def command(self) -> str:
        return Path(self.program).name if self.program else self.args[0]


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
        # issue 23 item 1: a special file named as an output is written to in place, never renamed over
        P(["doctor", "--json", "fifo.json"], 0, "--json a named pipe (read by a thread)", setup="fifo",
          check="fifo_kept"),
        P(["doctor", "--json", "stdout.json"], 0, "--json a link to /proc/self/fd/1", setup="fdlink",
          check="fdlink_kept"),
        P(["doctor", "--json", "null"], 0, "--json a character device (a /dev/null)", setup="chardev",
          check="chardev_kept"),
        P(["doctor", "--json", "link.json"], 0, "--json a symlink to another JSON file", setup="jsonlink",
          outputs=["link.json"], check="jsonlink_replaced"),
        # item 2: outputs over inputs the output check did not see
        P(["train", "--init", "ckpt.pth", "-o", "ckpt.pth", "--epochs", "1"], 2, "--init X -o X"),
        P(["import", "hf", "-o", "hf/model.safetensors"], 2, "-o a Hugging Face folder's own weights"),
        # issue 37 P3-P6: a foreign folder's index names files inside it; sizes read have ceilings; -o is a checkpoint
        P(["import", "shards", "-o", "s.pth"], 1, "a shard index naming ../ckpt.pth (outside its folder)",
          setup="shard_index"),
        P(["import", "ckpt.pth", "--labels", "labels.fifo", "-o", "l.pth"], 2, "--labels a FIFO", setup="labels_fifo"),
        P(["import", "ckpt.pth", "--labels", "/dev/zero", "-o", "l.pth"], 2, "--labels /dev/zero"),
        P(["import", "ckpt.pth", "--image-size", "1" + "0" * 30, "-o", "i.pth"], 2, "--image-size 10**30"),
        P(["import", "ckpt.pth", "-o", "c.onnx"], 2, "a checkpoint under an ONNX name"),
        P(["verify", "model.onnx", "model.onnx", "--images", "img", "--report", "img"], 2,
          "--report the --images folder"),
        P(["verify", "model.onnx", "model.onnx", "--images", "img", "--report", "site"], 2,
          "--report a folder with a user's index.html"),
        P(["train", "--epochs", "1", "-o", "t.pth"], 0, "an earlier interrupted run's t.pth.partial",
          setup="partial", outputs=["t.pth", "t.pth.partial", "t.pth.partial.1"], check="partial_kept", slow=True),
        # item 3: a model whose logits are NaN never passes; JSON is strict
        P(["verify", "model.onnx", "bad/nan.onnx", "--images", "img"], 1, "a candidate whose logits are NaN"),
        P(["verify", "model.onnx", "bad/nan.onnx", "--images", "img", "--json", "-"], 1,
          "--json - of a NaN candidate", check="stdout_strict_json"),
        P(["infer", "img", "--model", "bad/nan.onnx"], 1, "infer with a NaN model", check="names_nan"),
        P(["bundle", "bad/nan.onnx", "-o", "b", "--references", "2", "--check-images", "img"], 1,
          "bundle a NaN model", slow=True),
        # item 4: file names are bytes
        P(["infer", "bytes", "-o", "x.csv"], 0, "a file name that is not UTF-8 (CSV)", outputs=["x.csv"],
          check="csv_has_escaped_name"),
        P(["calibrate", "model.onnx", "--images", "bytes", "-o", "m.int8.onnx", "--batch-size", "1"], 0,
          "calibration images with a non-UTF-8 name", outputs=["m.int8.onnx", "m.int8.calib.json"], slow=True),
        # item 5: the bundle follows the umask
        P(["bundle", "model.onnx", "-o", "b", "--references", "2", "--check-images", "img"], 0,
          "bundle under umask 077", umask=0o077, outputs=["b"], check="bundle_umask_077", slow=True),
        # item 6: benchmark has an end
        P(["benchmark", "model.onnx", "--seconds", "inf", "--batch-sizes", "1"], 2, "--seconds inf", timeout=60),
        P(["benchmark", "model.onnx", "--seconds", "1e300", "--batch-sizes", "1"], 2, "--seconds 1e300",
          timeout=60),
        P(["benchmark", "model.onnx", "--seconds", "0.001", "--batch-sizes", "1", "--backends", "onnxruntime"], 2,
          "--seconds 0.001 (no full round)", timeout=120, slow=True),
        P(["benchmark", "model.onnx", "--batch-sizes", "1 8"], 2, "--batch-sizes '1 8' (not 18)"),
        P(["benchmark", "model.onnx", "--batch-sizes", "1,,8"], 2, "--batch-sizes '1,,8'"),
        P(["benchmark", "model.onnx", "--seconds", "600", "--batch-sizes", "1", "--backends", "onnxruntime"], 130,
          "Ctrl-C while a worker is busy", signal_after=(signal.SIGINT, 3.0), check="stopped_at_once", slow=True),
        P(["benchmark", "model.onnx", "--seconds", "600", "--batch-sizes", "1", "--backends", "onnxruntime"], -9,
          "the parent killed (SIGKILL) mid-round", signal_after=(signal.SIGKILL, 3.0), check="no_workers_left",
          slow=True),
        P(["bundle", "model.onnx", "--references", "1000000000"], 2, "--references 1000000000", timeout=60),
        # item 9: a full disk (a small tmpfs) leaves nothing behind
        P(["calibrate", "model.onnx", "--images", "img", "-o", "full/m.int8.onnx", "--batch-size", "1"], 1,
          "a full disk (calibrate)", setup="full:64k", check="full_empty", slow=True),
        P(["verify", "model.onnx", "model.onnx", "--images", "img2", "--report", "full/r"], 1,
          "a full disk (verify --report)", setup="full:24k", check="full_empty", slow=True),
        P(["explain", "img/a.png", "img2/a.png", "--model", "model.onnx", "-o", "full/maps"], 1,
          "a full disk (explain)", setup="full:map", check="full_empty", slow=True),
        P(["train", "--epochs", "3", "-o", "full/t.pth"], 1, "a full disk (train's .partial)", setup="full:ckpt",
          check="full_empty", slow=True),
        # item 10
        P(["export", "bad/legacy.pth"], 1, "a legacy (non-zip) torch.save file", check="says_legacy"),
        *lineage_probes(),
    ]


# ------------------------------------------------------------------ issue 31 (h6): --force, lineage, references
# A bundle folder holding a user's files, a source replaced while a command converts it (HOOKS: the other program,
# run inside the command's process at the moment named), an unreadable reference image. All slow (a bundle or an
# export each); tests/test_bundle_force_keeps.py and tests/test_lineage_hashes_loaded.py hold the same cases.


def lineage_probes() -> list[Probe]:
    P = Probe
    bundle = ["--references", "2", "--opt-batch", "1", "--max-batch", "2"]
    return [
        P(["bundle", "model.onnx", "-o", "ub", "--force", "-i", "img", *bundle], 0,
          "--force over a bundle holding a user's csv and engine", setup="user_bundle", outputs=["ub"],
          check="user_files_kept", slow=True),
        P(["bundle", "model.onnx", "-o", "b", "-i", "refs", *bundle], 3, "an empty file among the reference images",
          setup="refs", outputs=["b"], check="names_empty_ref", slow=True),
        P(["export", "ckpt.pth", "--no-check"], 1, "ckpt.pth renamed over while export runs", setup="ckpt2",
          hook="ckpt_renamed_during_export", others=["ckpt.pth", "ckpt2.pth"], check="says_changed", slow=True),
        P(["convert-fp16", "model.onnx", "-o", "m.fp16.onnx"], 1, "model.onnx re-exported while convert-fp16 runs",
          setup="model2", hook="onnx_replaced_during_fp16", others=["model.onnx", "model2.onnx"], check="says_changed",
          slow=True),
        P(["bundle", "model.onnx", "-o", "b", "-i", "img", *bundle], 1, "model.onnx re-exported while bundle runs",
          setup="model2", hook="onnx_replaced_during_bundle", others=["model.onnx", "model2.onnx"],
          check="says_changed", slow=True),
    ]


# what the other program does, patched into the command's process at the moment named (after the source was read)
_HOOK = """
import os, sys
import {module} as m
real = m.{name}
def other_program(*a, **k):
    os.replace({src!r}, {dest!r})
    return real(*a, **k)
m.{name} = other_program
from vitdeploy.__main__ import main
sys.exit(main())
"""
HOOKS = {
    "ckpt_renamed_during_export": _HOOK.format(module="vitdeploy.stages.export", name="_torch_export",
                                               src="ckpt2.pth", dest="ckpt.pth"),
    "onnx_replaced_during_fp16": _HOOK.format(module="vitdeploy.stages.precision", name="_fit_graph",
                                              src="model2.onnx", dest="model.onnx"),
    "onnx_replaced_during_bundle": _HOOK.format(module="vitdeploy.stages.bundle", name="check_target",
                                                src="model2.onnx", dest="model.onnx"),
}
_CODE = REPO  # the checkout probed (run_probe sets it): a setup that runs vitdeploy runs that one


def lineage_prepare(root: Path, what: str) -> None:
    """The setups of lineage_probes."""
    if what == "user_bundle":  # a bundle, then what a user adds on the device
        env = {**os.environ, "PYTHONPATH": str(_CODE)}
        subprocess.run([sys.executable, "-m", "vitdeploy", "bundle", "model.onnx", "-o", "ub", "-i", "img",
                        "--references", "2", "--opt-batch", "1", "--max-batch", "2"], cwd=root, env=env, check=True,
                       capture_output=True, timeout=600)
        (root / "ub" / "field_results.csv").write_text("notes\n")
        (root / "ub" / "model.raw.engine").write_bytes(b"an engine built on the device")
    elif what == "refs":
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / "0_empty.png").write_bytes(b"")
        shutil.copy(root / "img" / "a.png", root / "refs" / "a.png")
        shutil.copy(root / "img2" / "a.png", root / "refs" / "b.png")
    elif what == "ckpt2":  # the same checkpoint with other weights, as more training gives
        subprocess.run([sys.executable, "-c", "import sys, torch\n"
                        "d = torch.load(sys.argv[1], weights_only=True)\n"
                        "d['state_dict'] = {k: v * 1.25 for k, v in d['state_dict'].items()}\n"
                        "torch.save(d, sys.argv[2])", str(root / "ckpt.pth"), str(root / "ckpt2.pth")],
                       check=True, capture_output=True, timeout=600)
    elif what == "model2":  # a re-export with other weights
        subprocess.run([sys.executable, "-c", "import sys, onnx\nfrom onnx import numpy_helper as nh\n"
                        "m = onnx.load(sys.argv[1])\n"
                        "t = max(m.graph.initializer, key=lambda t: len(t.raw_data) + len(t.float_data))\n"
                        "t.CopyFrom(nh.from_array(nh.to_array(t) * 1.5, t.name))\n"
                        "onnx.save(m, sys.argv[2])", str(root / "model.onnx"), str(root / "model2.onnx")],
                       check=True, capture_output=True, timeout=600)


LINEAGE_CHECKS: dict[str, Callable[[Path, subprocess.CompletedProcess[str], float], str | None]] = {
    "user_files_kept": lambda r, p, t: None if (r / "ub" / "field_results.csv").is_file()
    and ((r / "ub" / "model.raw.engine").is_file() or (r / "ub" / "earlier" / "model.raw.engine").is_file())
    and "field_results.csv" in p.stdout else "the user's files were deleted or not named",
    "names_empty_ref": lambda r, p, t: None if "0_empty.png" in p.stdout + p.stderr else "the empty image is not named",
    "says_changed": lambda r, p, t: None if "changed while" in p.stderr and "bug" not in p.stderr
    else "not named a source changed during the run",
}


# ------------------------------------------------------------------ promises beyond exit code and files


def _workers(root: Path) -> list[int]:
    """This scratch folder's benchmark workers still alive (they run in it: their working folder is the root)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{d}/cwd")
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if b"vitdeploy.tools.bench_worker" in cmd and cwd == str(root.resolve()) and state != "Z":
            out.append(int(d))
    return out


def _strict(text: str) -> str | None:
    def bare(c: str) -> None:
        raise ValueError(f"bare {c}")

    try:
        json.loads(text, parse_constant=bare)
    except ValueError as e:
        return f"not strict JSON ({str(e)[:40]})"
    return None


def _modes_under_077(root: Path) -> str | None:
    b = root / "b"
    loose = [p for p in [b, *b.rglob("*")] if stat.S_IMODE(p.lstat().st_mode) & 0o077] if b.is_dir() else []
    return f"{len(loose)} group/other-readable, e.g. {loose[0].relative_to(root)}" if loose else None


CHECKS: dict[str, Callable[[Path, subprocess.CompletedProcess[str], float], str | None]] = {
    "fifo_kept": lambda r, p, t: None if stat.S_ISFIFO((r / "fifo.json").lstat().st_mode) else "the FIFO was replaced",
    "fdlink_kept": lambda r, p, t: None if (r / "stdout.json").is_symlink() and '"python"' in p.stdout
    else "the /proc link was replaced",
    "chardev_kept": lambda r, p, t: None if stat.S_ISCHR((r / "null").lstat().st_mode) else "the device was replaced",
    # issue 40: a link at an output is replaced, never written through (its target may be an input)
    "jsonlink_replaced": lambda r, p, t: None if not (r / "link.json").is_symlink()
    and '"python"' in (r / "link.json").read_text() and (r / "real.json").read_text() == '{"old": true}\n'
    else "written through the symlink (its target was replaced)",
    "partial_kept": lambda r, p, t: None if any(f.is_file() and f.read_bytes() == EARLIER for f in r.iterdir())
    else "the earlier run's partial best was overwritten",
    "stdout_strict_json": lambda r, p, t: _strict(p.stdout),
    "names_nan": lambda r, p, t: None if "NaN" in p.stderr else "NaN not named",
    "csv_has_escaped_name": lambda r, p, t: None if "bad\\xff.png" in (r / "x.csv").read_text(encoding="utf-8")
    else "the name is missing",
    "bundle_umask_077": lambda r, p, t: _modes_under_077(r),
    "stopped_at_once": lambda r, p, t: (f"took {t:.0f} s to stop" if t > 10 else None) or
    (f"{len(w)} worker(s) left running" if (w := _workers(r)) else None),
    "no_workers_left": lambda r, p, t: (f"{len(w)} worker(s) still running 10 s after the parent died"
                                        if (w := _workers(r)) else None),
    "full_empty": lambda r, p, t: (f"left {', '.join(sorted(f.name for f in (r / 'full').iterdir()))[:40]}"
                                   if any((r / "full").iterdir()) else None),
    "says_legacy": lambda r, p, t: None if "legacy torch.save" in p.stderr else "not named a legacy torch.save file",
    **LINEAGE_CHECKS,
}
EARLIER = b"the best epoch of an earlier, interrupted run"


# ------------------------------------------------------------------ the scratch folder


def make_scratch(root: Path, code: Path, ckpt: Path | None = None, onnx: Path | None = None) -> None:
    """A digits checkpoint (``ckpt``, copied, else one trained for an epoch), its ONNX export (``onnx``, copied: a
    caller that already has ``vitdeploy export``'s output of ``ckpt`` saves the export), real digit images, a broken
    PNG and a decompression bomb."""
    import numpy as np
    from PIL import Image

    env = {**os.environ, "PYTHONPATH": str(code)}
    if ckpt is not None:
        shutil.copyfile(ckpt, root / "ckpt.pth")  # a copy: the caller's checkpoint is never changed
    script = (
        "from pathlib import Path\n"
        "from vitdeploy.model.data import write_digits\n"
        f"r = Path({str(root)!r})\n"
        + ("" if ckpt is not None else
           "from vitdeploy.model.train import TrainOptions, train\n"
           "train(None, TrainOptions(epochs=1, out=r / 'ckpt.pth', seed=0))\n")
        + "write_digits(r / 'digits')\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env=env, capture_output=True, timeout=600)
    if onnx is not None and ckpt is not None:
        shutil.copyfile(onnx, root / "model.onnx")
    else:
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
    # issue 23: a NaN model, a non-UTF-8 file name, a legacy pickle, a Hugging Face folder, a user's web page
    (root / "bad").mkdir()  # not beside model.onnx: infer and benchmark would pick the newest model there
    subprocess.run([sys.executable, "-c", NAN_MODEL, str(root / "model.onnx"), str(root / "bad" / "nan.onnx")],
                   check=True,
                   env=env, capture_output=True, timeout=600)
    (root / "bytes").mkdir()
    shutil.copy(val[2], root / "bytes" / "ok.png")
    shutil.copy(val[3], os.path.join(os.fsencode(root / "bytes"), b"bad\xff.png"))
    subprocess.run([sys.executable, "-c", "import sys, torch; torch.save({'w': torch.zeros(2)}, sys.argv[1], "
                    "_use_new_zipfile_serialization=False)", str(root / "bad" / "legacy.pth")], check=True, capture_output=True)
    (root / "hf").mkdir()
    (root / "hf" / "config.json").write_text('{"model_type": "vit"}')
    (root / "hf" / "model.safetensors").write_bytes(b"the folder's own weights")
    (root / "site").mkdir()
    (root / "site" / "index.html").write_text("<html>a user's own page</html>\n")
    # a real PNG whose pixel count is over PIL's decompression-bomb limit (2 x MAX_IMAGE_PIXELS): it compresses small
    bomb = Image.fromarray(np.zeros((1, 1), np.uint8))
    bomb = bomb.resize((16000, 12000))
    bomb.save(root / "mixed" / "bomb.png")
    shutil.rmtree(root / "digits")
    make_scratch_issue37(root, env)
    global _CODE
    _CODE = code
    _h40_clip(root)  # issue 40's CLIP and open_clip pairs: made once with the scratch folder (tens of seconds)


NAN_MODEL = """
import sys, numpy as np, onnx
from onnx import helper, numpy_helper
m = onnx.load(sys.argv[1])
out = m.graph.output[0].name
for node in m.graph.node:
    node.output[:] = [o + "_pre_nan" if o == out else o for o in node.output]
m.graph.initializer.append(numpy_helper.from_array(np.array(np.nan, np.float32), "nan_scale"))
m.graph.node.append(helper.make_node("Mul", [out + "_pre_nan", "nan_scale"], [out]))
onnx.save(m, sys.argv[2])
"""


def shared_scratch(folder: Path, code: Path, ckpt: Path | None, onnx: Path | None = None) -> Path:
    """The scratch folder made once in ``folder`` (under a lock) and reused as it is by later runs, so the shards of
    one test run make it once. Each run probes a copy of it; delete ``folder`` after changing the code."""
    folder.mkdir(parents=True, exist_ok=True)
    made = folder / "scratch"
    with open(folder / "scratch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another shard making it: wait for it
        if not made.is_dir():
            part = folder / "scratch.partial"  # a run killed while making it leaves no half-made scratch
            shutil.rmtree(part, ignore_errors=True)
            part.mkdir()
            make_scratch(part, code, ckpt, onnx)
            part.rename(made)
    return made


def pristine(root: Path) -> Path:
    return root.with_name(root.name + ".pristine")


def restore(root: Path) -> None:
    """Put the scratch folder back as make_scratch left it (a probe that broke a promise may have changed it)."""
    shutil.rmtree(root)
    shutil.copytree(pristine(root), root, symlinks=True)


def prepare(root: Path, what: str | None) -> None:
    prepare_issue31(root, what)
    prepare_issue37(root, what)
    prepare_issue40(root, what)
    prepare_issue40_outputs(root, what)
    if what == "adir":
        (root / "adir").mkdir(exist_ok=True)
    elif what == "link":
        link = root / "link.onnx"
        if not link.exists():
            link.symlink_to(root / "model.onnx")
    elif what == "notes":
        (root / "notes").mkdir(exist_ok=True)
        (root / "notes" / "mine.txt").write_text("a user's notes\n")
    elif what == "fifo":
        os.mkfifo(root / "fifo.json")

        def drain() -> None:  # a reader, so the writer's open() returns; it ends when the writer closes
            with open(root / "fifo.json", "rb") as f:
                f.read()

        threading.Thread(target=drain, daemon=True).start()
    elif what == "fdlink":
        (root / "stdout.json").symlink_to("/proc/self/fd/1")
    elif what == "chardev":
        os.mknod(root / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the device /dev/null is
    elif what == "jsonlink":
        (root / "real.json").write_text('{"old": true}\n')
        (root / "link.json").symlink_to(root / "real.json")
    elif what == "partial":
        (root / "t.pth.partial").write_bytes(EARLIER)
    elif what == "shard_index":  # a sharded index whose weight_map leads out of its folder
        (root / "shards").mkdir(exist_ok=True)
        (root / "shards" / "config.json").write_text('{"model_type": "vit"}')
        (root / "shards" / "model.safetensors.index.json").write_text('{"weight_map": {"w": "../ckpt.pth"}}')
    elif what == "labels_fifo":  # no writer: a reader that opens it blocks for ever
        os.mkfifo(root / "labels.fifo")
    elif what in ("user_bundle", "refs", "ckpt2", "model2"):
        lineage_prepare(root, what)
    elif what and what.startswith("full:"):
        size = what.split(":", 1)[1]
        if size == "ckpt":  # room for one checkpoint, not two: the second epoch's partial fills it
            size = str(int((root / "ckpt.pth").stat().st_size * 1.5))
        elif size == "map":  # room for about one attention map
            size = "40k"
        (root / "full").mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root / "full")], check=True)


def teardown(root: Path, what: str | None) -> None:
    """Undo what ``prepare`` made that a snapshot or restore cannot copy (a FIFO, a device, a mount)."""
    if what and what.startswith("full:"):  # the empty mount point stays: it was there before the run
        subprocess.run(["umount", str(root / "full")], check=False)
    special = {"fifo": "fifo.json", "chardev": "null", "fdlink": "stdout.json", "labelfifo": "labels.fifo",
               "imgfifo": "fifo.png"}
    if what in special:
        (root / special[what]).unlink(missing_ok=True)


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


def _run(argv: list[str], root: Path, env: dict[str, str], p: Probe, timeout: float) -> tuple[
        subprocess.CompletedProcess[str], float]:
    """Run one probe's command; with ``signal_after``, signal it that long after its workers started (Ctrl-C, a
    kill) and return how long it took to end after the signal."""
    def pre() -> None:
        # Ctrl-C must reach the command: a probe started in the background (nohup ... &) has SIGINT ignored, and a
        # child inherits that (Python then installs no KeyboardInterrupt handler)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if p.umask is not None:
            os.umask(p.umask)
        if p.memory_gib is not None:
            import resource

            limit = int(p.memory_gib * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="backslashreplace", preexec_fn=pre)
    took = 0.0
    if p.signal_after is not None:
        sig, wait = p.signal_after
        end = time.monotonic() + timeout
        while not _workers(root) and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.2)
        time.sleep(wait)
        t0 = time.monotonic()
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        took = time.monotonic() - t0
        time.sleep(10 if sig == signal.SIGKILL else 1)  # a killed parent's workers: do they end?
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # still working after --timeout: the bad input was taken, not refused
        proc.kill()
        out, err = proc.communicate()
        return subprocess.CompletedProcess(argv, -9, out, err + "\n(killed: still running after the probe's timeout)"), took
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), took


def run_probe(p: Probe, root: Path, code: Path, timeout: float) -> Row:
    global _CODE
    _CODE = code
    prepare(root, p.setup)
    before, top = snapshot(root), fs_root()
    args = [a.replace("{w}", str(root)) for a in p.args]
    env = {**os.environ, "PYTHONPATH": str(code), "COLUMNS": "200"}
    cmd = ["-c", HOOKS[p.hook]] if p.hook else [str(root / p.program)] if p.program else ["-m", "vitdeploy"]
    r, took = _run([sys.executable, *cmd, *args], root, env, p, p.timeout or timeout)
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    try:
        promise = CHECKS[p.check](root, r, took) if p.check else None
    except (OSError, ValueError) as e:  # e.g. the output it should have written is not there
        promise = f"{p.check}: {type(e).__name__}"
    for w in _workers(root):  # a benchmark worker that outlived its parent: end it, the next probe starts clean
        os.kill(w, signal.SIGKILL)
    teardown(root, p.setup)
    after = snapshot(root)
    changed_all = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    changed = [c for c in changed_all if c not in p.others]  # the other program's doing is not the command's
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
    if promise:
        broken.append(promise)
    if changed_all:  # the next probe starts from the same files
        restore(root)
    shown = [c.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace") for c in changed + outside_root]
    return Row(p, r.returncode, (err[-1] if err else "")[:90], "Traceback" in r.stderr, shown, broken)


def shard(text: str) -> tuple[int, int]:
    """``I/N`` (0 <= I < N) for --shard."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write I/N, e.g. 0/3") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"{text!r}: I must be in 0..N-1")
    return i, n


# ================================================================== issue 31, the CLI's share (h7-cli): ranges, text
# Kept apart from the probes above so the device and lineage sections of issue 31 merge beside it.

HOSTILE_LABELS = ["\x1b[2Jcleared", "two\nlines", "\u202eexe.doc", '=HYPERLINK("http://x")', "+1", "-2", "@sum",
                  "\ufeffcat", "ok", "[/]"]
CONTROLS = "\x1b\u202e\ufeff"


def issue31_cli_probes() -> list[Probe]:
    P = Probe
    big = "99999999999999999999"
    return [
        # 7, 15: every numeric option has a range, checked before any work (a run that goes on counts as broken)
        P(["train", "--workers", big, "-o", "t.pth"], 2, "--workers 10^20 (a fork bomb)", timeout=60),
        P(["train", "--epochs", big, "-o", "t.pth"], 2, "--epochs 10^20", timeout=60),
        P(["train", "--weight-decay", "inf", "-o", "t.pth"], 2, "--weight-decay inf (NaN weights)", timeout=60),
        P(["train", "--seed", "-1", "-o", "t.pth"], 2, "--seed -1", timeout=60),
        P(["bundle", "model.onnx", "--max-batch", big], 2, "--max-batch 10^20 (Triton rejects)", timeout=60),
        P(["benchmark", "model.onnx", "--iterations", big + "0"], 2, "--iterations 10^20", timeout=60),
        P(["benchmark", "model.onnx", "--warmup", "1e20"], 2, "--warmup 1e20", timeout=60),
        P(["build-engine", "model.onnx", "--workspace", "inf"], 2, "--workspace inf", timeout=60),
        # 11: --threads has a ceiling (the cores)
        P(["verify", "model.onnx", "model.onnx", "--images", "img", "--threads", "100000"], 2, "--threads 100000",
          timeout=60),
        P(["infer", "img", "--backend", "onnxruntime", "--threads", "100000"], 2, "--threads 100000", timeout=60),
        P(["explain", "img/a.png", "--model", "model.onnx", "--threads", "100000"], 2, "--threads 100000", timeout=60),
        P(["benchmark", "model.onnx", "--threads", "100000"], 2, "--threads 100000", timeout=60),
        # 12b: a batch past the range (or past free memory) is refused before the images are decoded
        P(["infer", "img", "-m", "model.onnx", "-b", "100000"], 2, "-b 100000", timeout=60),
        # 8: labels and names are printed as escapes; CSV cells cannot start a formula
        P(["info", "hostile.onnx"], 0, "labels with escapes, newlines, bidi", setup="hostile", check="no_controls"),
        P(["infer", "img", "-m", "hostile.onnx", "-k", "10", "-o", "h.csv"], 0, "labels that start formulas",
          setup="hostile", check="csv_neutral", outputs=["h.csv"]),
        # 16: a label file's BOM is not part of the first label
        P(["export", "ckpt.pth", "-o", "l.onnx", "--labels", "bom.txt", "--no-check"], 0, "--labels with a BOM",
          setup="bom", check="bom_gone", outputs=["l.onnx"], slow=True),
    ]


def _no_controls(p: subprocess.CompletedProcess[str]) -> str | None:
    bad = [c for c in CONTROLS if c in p.stdout + p.stderr]
    return f"printed {', '.join(repr(c) for c in bad)}" if bad else None


def _csv_neutral(root: Path, p: subprocess.CompletedProcess[str]) -> str | None:
    import csv

    with (root / "h.csv").open(newline="", encoding="utf-8") as f:
        cells = [c for row in csv.reader(f) for c in row]
    formulas = [c for c in cells if c.startswith(("=", "+", "-", "@"))]
    return f"formula cells {formulas[:3]}" if formulas else _no_controls(p)


def _bom_gone(root: Path) -> str | None:
    import onnx

    m = onnx.load(str(root / "l.onnx"), load_external_data=False)
    man = json.loads(next(x.value for x in m.metadata_props if x.key == "vitdeploy.manifest"))
    return None if man["labels"][0] == "zero" else f"first label {man['labels'][0]!r}"


def prepare_issue31(root: Path, what: str | None) -> None:
    if what == "hostile" and not (root / "hostile.onnx").exists():
        import onnx

        m = onnx.load(str(root / "model.onnx"))
        for prop in m.metadata_props:
            if prop.key == "vitdeploy.manifest":
                man = json.loads(prop.value)
                man["labels"] = HOSTILE_LABELS
                prop.value = json.dumps(man)
        onnx.save(m, str(root / "hostile.onnx"))
    elif what == "bom":
        names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
        (root / "bom.txt").write_bytes(("\n".join(names) + "\n").encode("utf-8-sig"))


CHECKS.update({
    "no_controls": lambda r, p, t: _no_controls(p),
    "csv_neutral": lambda r, p, t: _csv_neutral(r, p),
    "bom_gone": lambda r, p, t: _bom_gone(r),
})


# ------------------------------------------------------------------ issue 37 (h4): the import surface, bundle, run.py
# Hostile Hugging Face and timm folders, each a copy of a small real one (transformers' save_pretrained, timm's
# save_for_hf, made once in the scratch folder) with one field edited; options naming special files; bundle's checks
# before work over an earlier -t cpu bundle; run.py's reads. The documented codes: a foreign file's bad field 1 (one
# line naming the file and the field), an option's bad value or an output inside the input folder 2, run.py's usage 2.

FOREIGN = r"""
import sys
from pathlib import Path
import timm, torch
from timm.models import _hub
from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor
r = Path(sys.argv[1])
torch.manual_seed(0)
cfg = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32,
                patch_size=8, num_labels=3, id2label={0: "a", 1: "b", 2: "c"}, label2id={"a": 0, "b": 1, "c": 2})
ViTForImageClassification(cfg).eval().save_pretrained(r / "hfvit")
ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(r / "hfvit")
args = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2}
m = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, weight_init="skip", **args).eval()
_hub.save_for_hf(m, r / "timmvit", safe_serialization=True, model_args=args)
_hub.save_for_hf(m, r / "timmbin", safe_serialization=False, model_args=args)  # pytorch_model.bin
"""


def make_scratch_issue37(root: Path, env: dict[str, str]) -> None:
    """h37/hfvit and h37/timmvit (h37/timmbin: its weights as pytorch_model.bin), each setup's hostile copy made from
    them; cpub/: a digits checkpoint bundled for -t cpu (FP32 and FP16, so no calibration) into cpub/b, its
    model.onnx and model.fp16.onnx beside the checkpoint, where a later bundle of it would replace them."""
    (root / "h37").mkdir()
    subprocess.run([sys.executable, "-c", FOREIGN, str(root / "h37")], check=True, env=env, capture_output=True,
                   timeout=600)
    (root / "cpub").mkdir()
    shutil.copyfile(root / "ckpt.pth", root / "cpub" / "ckpt.pth")
    subprocess.run([sys.executable, "-m", "vitdeploy", "bundle", "ckpt.pth", "-t", "cpu", "--fp16", "-o", "b",
                    "--references", "2", "-i", str(root / "img")], cwd=root / "cpub", check=True, env=env,
                   capture_output=True, timeout=600)


def _config(folder: Path, name: str = "config.json") -> tuple[Path, object]:
    path = folder / name
    return path, json.loads(path.read_text())


def _set(*keys: str, value: object, name: str = "config.json") -> Callable[[Path], None]:
    """An edit: the field at ``keys`` of the folder's ``name`` set to ``value`` (NaN and Infinity as JSON's tokens)."""
    def edit(folder: Path) -> None:
        path, doc = _config(folder, name)
        node = doc
        for k in keys[:-1]:
            node = node[k]  # type: ignore[index]
        node[keys[-1]] = value  # type: ignore[index]
        path.write_text(json.dumps(doc))
    return edit


def _whole(text: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / "config.json").write_text(text)
    return edit


def _sharded(where: str) -> Callable[[Path], None]:
    """model.safetensors moved out of the folder, named by a model.safetensors.index.json: ``where`` is "outside"
    (../), "absolute", "int" (weight_map values that are numbers) or "list" (weight_map a list)."""
    def edit(folder: Path) -> None:
        weights = folder / "model.safetensors"
        raw = weights.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        keys = [k for k in json.loads(raw[8 : 8 + n]) if k != "__metadata__"]
        outside = folder.parent / f"{folder.name}.outside.safetensors"
        weights.rename(outside)
        target: object = {"outside": f"../{outside.name}", "absolute": str(outside), "int": 1}.get(where)
        weight_map: object = [f"../{outside.name}"] if where == "list" else {k: target for k in keys}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return edit


DEEP = '{"model_type": "vit", "x": ' + "[" * 100000 + "]" * 100000 + "}"

# setup "h37:NAME": a copy of h37/BASE as h37/NAME with EDIT applied (the hostile field, in words, is the probe's)
HOSTILE: dict[str, tuple[str, Callable[[Path], None]]] = {
    "heads0": ("hfvit", _set("num_attention_heads", value=0)),
    "heads-neg": ("hfvit", _set("num_attention_heads", value=-2)),
    "heads-str": ("hfvit", _set("num_attention_heads", value="two")),
    "size-str": ("hfvit", _set("image_size", value="big")),
    "size-null": ("hfvit", _set("image_size", value=None)),
    "size-0": ("hfvit", _set("image_size", value=0)),
    "size-huge": ("hfvit", _set("image_size", value=10**6)),
    "chans-str": ("hfvit", _set("num_channels", value="three")),
    "eps-nan": ("hfvit", _set("layer_norm_eps", value=float("nan"))),
    "eps-neg": ("hfvit", _set("layer_norm_eps", value=-1e-6)),
    "hidden-inf": ("hfvit", _set("hidden_size", value=float("inf"))),
    "cfg-list": ("hfvit", _whole("[1, 2, 3]")),
    "cfg-deep": ("hfvit", _whole(DEEP)),
    "id2label-list": ("hfvit", _set("id2label", value=[{"0": "a"}, {"1": "b"}, {"2": "c"}])),
    "id2label-gaps": ("hfvit", _set("id2label", value={"0": "a", "2": "b", "7": "c"})),
    "pp-size0": ("hfvit", _set("size", value={"height": 0, "width": 0}, name="preprocessor_config.json")),
    "pp-mean2": ("hfvit", _set("image_mean", value=[0.5, 0.5], name="preprocessor_config.json")),
    "pp-rescale0": ("hfvit", _set("rescale_factor", value=0, name="preprocessor_config.json")),
    "shard-outside": ("hfvit", _sharded("outside")),
    "shard-absolute": ("hfvit", _sharded("absolute")),
    "shard-int": ("hfvit", _sharded("int")),
    "shard-list": ("hfvit", _sharded("list")),
    "t-heads0": ("timmvit", _set("model_args", "num_heads", value=0)),
    "t-patch0": ("timmvit", _set("model_args", "patch_size", value=0)),
    "t-input-str": ("timmvit", _set("pretrained_cfg", "input_size", value="x")),
    "t-input-2": ("timmvit", _set("pretrained_cfg", "input_size", value=[32, 32])),
    "t-crop": ("timmvit", _set("pretrained_cfg", "crop_pct", value=1e-4)),
    "t-labels-str": ("timmvit", _set("label_names", value="abc")),
    "t-labels-count": ("timmvit", _set("label_names", value=["a", "b"])),
}


# in the fast set (CI): one folder per kind the issue names (a field zero, a string, null; a JSON list; deep nesting; a
# preprocessor size 0; id2label gaps; a shard outside the folder); each costs an import (a few CPU-s), so the other
# variants of the same mechanism run in the full set only
FAST_HOSTILE = {"heads0", "size-str", "size-null", "cfg-list", "cfg-deep", "pp-size0", "id2label-gaps", "shard-outside"}


def _no_raw_exception(p: subprocess.CompletedProcess[str]) -> str | None:
    """The one line names the problem, not a Python exception ("error: ZeroDivisionError: integer modulo by zero")."""
    import re

    hit = re.search(r"error: ([A-Z]\w*(Error|Exception))\b", p.stderr)
    return f"a raw {hit.group(1)}" if hit else None


CHECKS["no_raw_exception"] = lambda r, p, t: _no_raw_exception(p)


def issue37_probes() -> list[Probe]:
    P = Probe
    hostile = {  # NAME: the bad input, in words
        "heads0": "HF num_attention_heads 0", "heads-neg": "HF num_attention_heads -2",
        "heads-str": "HF num_attention_heads a string", "size-str": "HF image_size a string",
        "size-null": "HF image_size null", "size-0": "HF image_size 0", "size-huge": "HF image_size 10^6",
        "chans-str": "HF num_channels a string", "eps-nan": "HF layer_norm_eps NaN",
        "eps-neg": "HF layer_norm_eps negative", "hidden-inf": "HF hidden_size Infinity",
        "cfg-list": "config.json a JSON list", "cfg-deep": "config.json nested 100000 deep",
        "id2label-list": "id2label a list of dicts", "id2label-gaps": "id2label with gaps (0, 2, 7)",
        "pp-size0": "preprocessor size 0x0", "pp-mean2": "preprocessor image_mean of 2 values",
        "pp-rescale0": "preprocessor rescale_factor 0", "shard-outside": "shard weight_map ../ outside the folder",
        "shard-absolute": "shard weight_map an absolute path", "shard-int": "shard weight_map values numbers",
        "shard-list": "shard weight_map a list", "t-heads0": "timm model_args.num_heads 0",
        "t-patch0": "timm model_args.patch_size 0", "t-input-str": "timm pretrained_cfg.input_size a string",
        "t-input-2": "timm input_size of length 2", "t-crop": "timm crop_pct 1e-4",
        "t-labels-str": "timm label_names a string", "t-labels-count": "timm label_names of the wrong count",
    }
    assert set(hostile) == set(HOSTILE)
    big = "1" + "0" * 30
    return [
        *(P(["import", f"h37/{name}", "-o", "o.pth"], 1, what, setup=f"h37:{name}", timeout=120, check="no_raw_exception",
            slow=name not in FAST_HOSTILE) for name, what in hostile.items()),
        # options and outputs of import (P5, P6): exit 2 before the weights are read
        P(["import", "h37/timmbin", "-o", "h37/timmbin/model.safetensors"], 2,
          "-o a weights name inside the input folder"),
        P(["import", "h37/hfvit", "-o", "x.onnx"], 2, "-o a checkpoint under an .onnx name"),
        P(["import", "h37/timmvit", "--labels", "/dev/zero", "-o", "o.pth"], 2, "--labels /dev/zero", timeout=60, check="no_raw_exception",
          memory_gib=6),
        P(["import", "h37/timmvit", "--labels", "labels.fifo", "-o", "o.pth"], 2, "--labels a FIFO",
          setup="labelfifo", timeout=60, check="no_raw_exception"),
        P(["import", "h37/hfvit", "--image-size", big, "-o", "o.pth"], 2, "--image-size 10^30", timeout=60, check="no_raw_exception",
          memory_gib=6),
        # bundle checks every option before the first artifact is touched (P8): the -t cpu bundle's files stay
        P(["bundle", "cpub/ckpt.pth", "-t", "trt8.6", "--min-batch", "8", "--max-batch", "2", "-o", "cpub/b2"], 2,
          "--min-batch 8 --max-batch 2 after a -t cpu bundle", timeout=120, check="no_raw_exception"),
        P(["bundle", "cpub/ckpt.pth", "-t", "trt10", "--quantizer", "nncf", "-o", "cpub/b2"], 2,
          "--quantizer nncf -t trt10 after a -t cpu bundle", timeout=120, check="no_raw_exception"),
        # run.py's reads (P5, P7): bounded, one line
        P(["fifo.png"], 1, "run.py: a FIFO as the image", program="cpub/b/run.py", setup="imgfifo",
          timeout=60, check="no_raw_exception"),
        P(["--check"], 1, "run.py: manifest.json nested 100000 deep", program="cpub/nested/run.py",
          setup="nested_manifest", timeout=60, check="no_raw_exception"),
        P(["--check", "--batch", "1000000000"], 2, "run.py --batch 1000000000", program="cpub/b/run.py",
          timeout=60, check="no_raw_exception", memory_gib=6),
    ]


# ------------------------------------------------------------------ issue 40 (B): every file a command writes is an output
# A link left where a side file goes (a features cache, a calibration cache, external data, an engine sidecar, a
# best-so-far checkpoint), pointing at the command's own input: refused before any work, the input intact. run.py
# --out over the bundle's own reference file. tests/test_side_outputs.py and tests/test_output_rule.py hold the same.


def issue40_output_probes() -> list[Probe]:
    P = Probe
    return [
        P(["train", "img", "--init", "ckpt.pth", "--probe", "knn", "-o", "p.pth"], 2,
          "B: features cache a symlink to --init", setup="side:p.pth.features.npz:ckpt.pth:symlink"),
        P(["train", "img", "--resume", "ckpt.pth", "-o", "t2.pth"], 2,
          "B: best-so-far (OUT.partial) a hard link to --resume", setup="side:t2.pth.partial:ckpt.pth:hardlink"),
        P(["calibrate", "model.onnx", "-i", "img", "-o", "c.onnx"], 2,
          "B: calibration cache a symlink to the model", setup="side:c.calib.json:model.onnx:symlink"),
        P(["export", "ckpt.pth", "--no-check", "-o", "e.onnx"], 2,
          "B: external data file a symlink to the checkpoint", setup="side:e.onnx.data:ckpt.pth:symlink"),
        P(["build-engine", "model.onnx", "-o", "x.engine"], 2,
          "B: engine sidecar a hard link to the model", setup="side:x.engine.json:model.onnx:hardlink"),
        P(["img/a.png", "--out", "cpub/b/reference/inputs.npy"], 2, "B: run.py --out the bundle's reference inputs",
          program="cpub/b/run.py", timeout=60),
    ]


def prepare_issue40_outputs(root: Path, what: str | None) -> None:
    """``side:NAME:INPUT:symlink|hardlink``: NAME made a link to INPUT (replacing one a previous run left)."""
    if not what or not what.startswith("side:"):
        return
    _, name, target, kind = what.split(":")
    link = root / name
    link.unlink(missing_ok=True)
    if kind == "symlink":
        link.symlink_to(target)
    else:
        os.link(root / target, link)


def prepare_issue37(root: Path, what: str | None) -> None:
    if what and what.startswith("h37:"):
        name = what.split(":", 1)[1]
        base, edit = HOSTILE[name]
        dest = root / "h37" / name
        if not dest.exists():
            shutil.copytree(root / "h37" / base, dest)
            edit(dest)
    elif what == "labelfifo":
        os.mkfifo(root / "labels.fifo")  # no writer: a reader that opens it waits for ever
    elif what == "imgfifo":
        os.mkfifo(root / "fifo.png")
    elif what == "nested_manifest" and not (root / "cpub" / "nested").exists():
        shutil.copytree(root / "cpub" / "b", root / "cpub" / "nested")
        (root / "cpub" / "nested" / "manifest.json").write_text('{"bundle": ' + "[" * 100000 + "]" * 100000 + "}")


# ================================================================== issue 40: what is shipped is what was asked for
# The families of issue 40's sections A-H, each a copy of what a new user did. Setups "h40:*" make, once per scratch
# folder: ab/ (checkpoint A = the scratch's ckpt.pth with its model.onnx beside it, and B.pth = A's weights x1.25),
# emb/ (the digits ViT exported as an embedding model, a two-class gallery with an unreadable image), h40/hf_clip (a
# small transformers CLIP pair with CLIP's BPE, tests/foundation_pairs.py) and edited copies of it, h40/open_clip.
# The documented codes: a refusal of an artifact that does not descend from the input 1 (issue 40 item 1), an output
# that is a link to an input 2 (as -o), a damaged bundle file 1, a foreign file's bad field 1, partly done 3; a class
# list or template that cannot make a classifier (a prompt past the text context, a tab, one class) 2, as --classes'
# other bad values.

_H40_PAIRS = r"""
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import foundation_pairs as fp
r = Path(sys.argv[1])
clip = fp.hf_clip(r, fp.clip_bpe_tokenizer(r / "clip_tok"))
fp.open_clip_pair(r, clip)  # the CLIP tokenizer saved beside the HF pair, as tests/test_zero_shot.py does
"""


def _h40_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(_CODE)}


def _vd(root: Path, *args: str, timeout: float = 600) -> None:
    subprocess.run([sys.executable, "-m", "vitdeploy", *args], cwd=root, env=_h40_env(), check=True,
                   capture_output=True, timeout=timeout)


def _h40_clip(root: Path) -> Path:
    """h40/hf_clip (and h40/open_clip), made once."""
    h = root / "h40"
    if not (h / "hf_clip").is_dir():
        h.mkdir(exist_ok=True)
        env = _h40_env()
        subprocess.run([sys.executable, "-c", _H40_PAIRS, str(h), str(REPO / "tests")], check=True, env=env,
                       capture_output=True, timeout=600)
        (h / "classes.txt").write_text("zero\none\ntwo\n")
    return h


def _h40_copy(root: Path, name: str, edit: Callable[[Path], None], base: str = "hf_clip") -> None:
    h = _h40_clip(root)
    if not (h / name).exists():
        shutil.copytree(h / base, h / name)
        edit(h / name)


def _truncate(name: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2])
    return edit


def _vocab_cut(folder: Path) -> None:
    """The slow tokenizer's files (vocab.json + merges.txt, as older save_pretrained wrote them) in place of
    tokenizer.json, vocab.json cut in half."""
    (folder / "tokenizer.json").unlink()
    tok = folder.parent / "clip_tok"
    shutil.copy(tok / "merges.txt", folder / "merges.txt")
    data = (tok / "vocab.json").read_bytes()
    (folder / "vocab.json").write_bytes(data[: len(data) // 2])


def _scale_tensor(key: str, value: float) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        import numpy as np
        from safetensors.numpy import load_file, save_file

        w = load_file(str(folder / "model.safetensors"))
        w[key] = np.full_like(w[key], value)
        save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return edit


def _text_config(field_name: str, value: object) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        doc = json.loads((folder / "config.json").read_text())
        doc["text_config"][field_name] = value
        (folder / "config.json").write_text(json.dumps(doc))
    return edit


def _open_clip_cfg(value: object) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        doc = json.loads((folder / "open_clip_config.json").read_text())
        doc["model_cfg"]["text_cfg"]["context_length"] = value
        (folder / "open_clip_config.json").write_text(json.dumps(doc))
    return edit


H40_COPIES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "vocab-cut": ("hf_clip", _vocab_cut),
    "tokjson-cut": ("hf_clip", _truncate("tokenizer.json")),
    "tokcfg-cut": ("hf_clip", _truncate("tokenizer_config.json")),
    "scale-nan": ("hf_clip", _scale_tensor("logit_scale", float("nan"))),
    "ctx-1": ("hf_clip", _text_config("max_position_embeddings", 1)),
    "oc-ctx-huge": ("open_clip", _open_clip_cfg(10**9)),
}


def _h40_ab(root: Path) -> None:
    ab = root / "ab"
    if ab.is_dir():
        return
    ab.mkdir()
    shutil.copyfile(root / "ckpt.pth", ab / "ckpt.pth")
    shutil.copyfile(root / "model.onnx", ab / "model.onnx")  # A's export, made from ab/ckpt.pth's bytes
    subprocess.run([sys.executable, "-c", "import sys, torch\n"
                    "d = torch.load(sys.argv[1], weights_only=True)\n"
                    "d['state_dict'] = {k: v * 1.25 for k, v in d['state_dict'].items()}\n"
                    "torch.save(d, sys.argv[2])", str(ab / "ckpt.pth"), str(ab / "B.pth")],
                   check=True, capture_output=True, timeout=600)


def _h40_embed(root: Path) -> None:
    e = root / "emb"
    if (e / "embed.onnx").is_file():
        return
    e.mkdir(exist_ok=True)
    _vd(root, "export", "ckpt.pth", "--embedding", "--normalize", "-o", "emb/embed.onnx", "--no-check")
    for cls, src in (("a", "img"), ("b", "img2")):
        (e / "gal" / cls).mkdir(parents=True, exist_ok=True)
        shutil.copy(root / src / "a.png", e / "gal" / cls / "x.png")
    shutil.copy(root / "img" / "a.png", e / "gal" / "b" / "y.png")
    (e / "gal" / "a" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    (e / "q").mkdir(exist_ok=True)  # a file named a<LF>b.png and one named a\nb.png
    shutil.copy(root / "img" / "a.png", e / "q" / "a\nb.png")
    shutil.copy(root / "img2" / "a.png", e / "q" / "a\\nb.png")


def prepare_issue40(root: Path, what: str | None) -> None:
    if not what or not what.startswith("h40:"):
        return
    name = what.split(":", 1)[1]
    if name == "ab":
        _h40_ab(root)
    elif name == "embed":
        _h40_embed(root)
    elif name == "clip":
        _h40_clip(root)
    elif name in H40_COPIES:
        base, edit = H40_COPIES[name]
        _h40_copy(root, name, edit, base)
    elif name == "files-link":
        _h40_embed(root)
        link = root / "e.files.txt"
        if not link.is_symlink():
            link.symlink_to(root / "emb" / "embed.onnx")
    elif name == "features-link":
        _h40_tiny(root)
        link = root / "p.pth.features.npz"
        if not link.is_symlink():
            link.symlink_to(root / "ckpt.pth")
    elif name == "ref-f16":  # a reference re-saved as float16 (and back): close in value, not the bytes shipped
        b = root / "cpub" / "f16"
        if not b.is_dir():
            shutil.copytree(root / "cpub" / "b", b, symlinks=True)
            import numpy as np

            ref = next(p for p in sorted((b / "reference").glob("*.npy")) if p.name != "inputs.npy")
            np.save(ref, np.load(ref).astype(np.float16).astype(np.float32))
    elif name == "ref-nan":
        b = root / "cpub" / "nanref"
        if not b.is_dir():
            shutil.copytree(root / "cpub" / "b", b, symlinks=True)
            import numpy as np

            ref = next(p for p in sorted((b / "reference").glob("*.npy")) if p.name != "inputs.npy")
            a = np.load(ref)
            a[0, 0] = np.nan
            np.save(ref, a)
    elif name == "classes":
        _h40_clip(root)
        h = root / "h40"
        (h / "long.txt").write_text("zero\none\n" + "x" * 10000 + "\n")
        (h / "tab.txt").write_text("zero\none\ttwo\n")
        (h / "one.txt").write_text("zero\n")
        (h / "cut.txt").write_text("a photo of " * 20 + "{}\n")  # {} past CLIP's 32-token context


def _h40_tiny(root: Path) -> None:
    """tiny/: an ImageFolder of two digit classes (train and val) for --probe."""
    t = root / "tiny"
    if t.is_dir():
        return
    for split in ("train", "val"):
        for cls, src in (("zero", "img"), ("one", "img2")):
            (t / split / cls).mkdir(parents=True)
            for i in range(4):
                shutil.copy(root / src / "a.png", t / split / cls / f"{i}.png")


def _said(*words: str) -> Callable[[Path, subprocess.CompletedProcess[str], float], str | None]:
    def check(r: Path, p: subprocess.CompletedProcess[str], t: float) -> str | None:
        text = p.stdout + p.stderr
        missing = [w for w in words if w not in text]
        return f"does not name {', '.join(missing)}" if missing else _no_raw_exception(p)
    return check


def _not_said(*words: str) -> Callable[[Path, subprocess.CompletedProcess[str], float], str | None]:
    def check(r: Path, p: subprocess.CompletedProcess[str], t: float) -> str | None:
        text = p.stdout + p.stderr
        wrong = [w for w in words if w in text]
        return f"says {', '.join(repr(w) for w in wrong)}" if wrong else _no_raw_exception(p)
    return check


def _distinct_file_lines(r: Path, p: subprocess.CompletedProcess[str], t: float) -> str | None:
    lines = (r / "q.files.txt").read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    return None if len(lines) == len(set(lines)) == 2 else f"file list lines {lines[:4]!r}"[:200]


CHECKS.update({
    "h40_names_input": _said("B.pth"),
    "h40_names_reference": _said("reference"),
    "h40_names_vocab": _said("vocab.json"),
    "h40_names_tokcfg": _said("tokenizer_config.json"),
    "h40_names_tokjson": _said("tokenizer.json"),
    "h40_names_scale": _said("logit_scale"),
    "h40_names_context": _said("context"),
    "h40_names_tokens": _said("tokens"),
    "h40_not_no_such_folder": _not_said("no such folder"),
    "h40_distinct_lines": _distinct_file_lines,
    "h40_no_raw": lambda r, p, t: _no_raw_exception(p),
})


def issue40_probes() -> list[Probe]:
    P = Probe
    refs = ["--references", "2", "-i", "img"]
    clip = "h40/hf_clip"
    return [
        # A: a bundle of B never ships A's model, nor replaces it silently (with and without -t)
        P(["bundle", "ab/B.pth", "-t", "cpu", "--fp16", "-o", "ab/bB", *refs], 1,
          "A: bundle B.pth beside A's model.onnx, -t cpu", setup="h40:ab", check="h40_names_input", timeout=300),
        P(["bundle", "ab/B.pth", "--fp16", "-o", "ab/bB", *refs], 1,
          "A: bundle B.pth beside A's model.onnx, no -t", setup="h40:ab", check="h40_names_input", timeout=300,
          slow=True),
        P(["bundle", "ab/B.pth", "-t", "trt10", "--fp16", "-o", "ab/bB", *refs], 1,
          "A: bundle B.pth beside A's model.onnx, another -t", setup="h40:ab", check="h40_names_input",
          timeout=300, slow=True),
        # B: side files through links onto inputs
        P(["infer", "img", "-m", "emb/embed.onnx", "-o", "e.npy"], 2, "B: e.files.txt a symlink to the model",
          setup="h40:files-link", check="h40_no_raw", timeout=300, slow=True),
        P(["train", "tiny", "--init", "ckpt.pth", "--probe", "knn", "-o", "p.pth"], 2,
          "B: p.pth.features.npz a symlink to --init", setup="h40:features-link", check="h40_no_raw", timeout=300,
          slow=True),
        # C: a prompt cut by the text context, a 10,000-character class name
        P(["import", clip, "--classes", "h40/classes.txt", "--templates", "h40/cut.txt", "-o", "zs.pth"], 2,
          "C: a template whose {} falls past the text context", setup="h40:classes", check="h40_names_tokens",
          timeout=300),
        P(["import", clip, "--classes", "h40/long.txt", "--templates", "simple", "-o", "zs.pth"], 2,
          "C: a 10,000-character class name", setup="h40:classes", check="h40_no_raw", timeout=300, slow=True),
        # D: an unreadable gallery image is partly done
        P(["infer", "img", "-m", "emb/embed.onnx", "--gallery", "emb/gal"], 3,
          "D: --gallery with an unreadable image", setup="h40:embed", timeout=300),
        # E: checks that miss tampering
        P(["--check", "--backend", "onnxruntime"], 1, "E: run.py --check, a reference re-saved as float16",
          program="cpub/f16/run.py", setup="h40:ref-f16", check="h40_names_reference", timeout=120),
        P(["info", "cpub/f16"], 1, "E: info BUNDLE, a reference re-saved as float16", setup="h40:ref-f16",
          check="h40_names_reference", timeout=120),
        P(["--check", "--backend", "onnxruntime"], 1, "E: run.py --check, a NaN in a reference",
          program="cpub/nanref/run.py", setup="h40:ref-nan", check="h40_names_reference", timeout=120, slow=True),
        # F: foreign files named
        P(["import", "h40/vocab-cut", "--classes", "h40/classes.txt", "-o", "zs.pth"], 1, "F: a truncated vocab.json",
          setup="h40:vocab-cut", check="h40_names_vocab", timeout=300, slow=True),
        P(["import", "h40/tokjson-cut", "--classes", "h40/classes.txt", "-o", "zs.pth"], 1,
          "F: a truncated tokenizer.json", setup="h40:tokjson-cut", check="h40_names_tokjson", timeout=300,
          slow=True),
        P(["import", "h40/tokcfg-cut", "--classes", "h40/classes.txt", "-o", "zs.pth"], 1,
          "F: a truncated tokenizer_config.json", setup="h40:tokcfg-cut", check="h40_names_tokcfg", timeout=300,
          slow=True),
        P(["import", "h40/scale-nan", "--classes", "h40/classes.txt", "-o", "zs.pth"], 1, "F: a NaN logit_scale",
          setup="h40:scale-nan", check="h40_names_scale", timeout=300),
        P(["import", "h40/ctx-1", "--classes", "h40/classes.txt", "-o", "zs.pth"], 1, "F: a text context of 1",
          setup="h40:ctx-1", check="h40_no_raw", timeout=300, slow=True),
        # G: sizes from a config checked before any allocation
        P(["import", "h40/oc-ctx-huge", "--classes", "h40/classes.txt", "-o", "zs.pth"], 1,
          "G: open_clip context_length 10^9", setup="h40:oc-ctx-huge", check="h40_names_context", timeout=300,
          memory_gib=8),
        # H: messages that say something false
        P(["infer", "img", "-m", "emb/embed.onnx", "--gallery", "img/a.png"], 2, "H: --gallery a file",
          setup="h40:embed", check="h40_not_no_such_folder", timeout=300, slow=True),
        P(["infer", "emb/q", "-m", "emb/embed.onnx", "-o", "q.npy"], 0, "H: files a<LF>b.png and a\\nb.png",
          setup="h40:embed", check="h40_distinct_lines", outputs=["q.npy", "q.files.txt"], timeout=300),
        P(["import", clip, "--classes", "h40/tab.txt", "-o", "zs.pth"], 2, "H: a tab in a class name",
          setup="h40:classes", check="h40_no_raw", timeout=300, slow=True),
        P(["import", clip, "--classes", "h40/one.txt", "-o", "zs.pth"], 2, "H: a one-class zero-shot classifier",
          setup="h40:classes", check="h40_no_raw", timeout=300, slow=True),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", action="store_true", help="only the quick probes (CI)")
    ap.add_argument("--code", type=Path, default=REPO, help="the checkout whose vitdeploy package to probe")
    ap.add_argument("--keep", type=Path, help="keep the scratch folder here")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds a probe may run; one still running then took the bad input (e.g. trained)")
    ap.add_argument("--only", action="append", default=[], metavar="TEXT",
                    help="only the probes whose command or input words contain TEXT (repeatable)")
    ap.add_argument("--shard", type=shard, metavar="I/N",
                    help="of the chosen probes (numbered from 0), only probe k with k %% N == I: N runs share them")
    ap.add_argument("--count", action="store_true", help="print how many probes would run, and run none")
    ap.add_argument("--ckpt", type=Path, metavar="PATH",
                    help="a trained digits checkpoint for the scratch folder (copied) instead of training one epoch")
    ap.add_argument("--scratch", type=Path, metavar="DIR",
                    help="make the scratch folder once in DIR and reuse it when it is there (the shards of a run)")
    ap.add_argument("--device", action="store_true", help="only issue 31's device-side cases (run.py, build_engine.sh)")
    a = ap.parse_args(argv)
    if a.device:
        return main_device(a.code.resolve(), a.keep)
    chosen = [p for p in probes() + issue31_cli_probes() + issue37_probes() + issue40_probes() + issue40_output_probes()
              if not (a.fast and p.slow)
              and (not a.only or any(t in f"{p.command} {p.what}" for t in a.only))]
    if a.shard:
        i, n = a.shard
        chosen = [p for k, p in enumerate(chosen) if k % n == i]
    if a.count:
        print(len(chosen))
        return 0
    if a.ckpt is not None and not a.ckpt.is_file():
        ap.error(f"--ckpt {a.ckpt}: no such file")
    ckpt = a.ckpt.resolve() if a.ckpt is not None else None
    with tempfile.TemporaryDirectory(prefix="vitdeploy-probe-") as tmp:
        root = (Path(a.keep) if a.keep else Path(tmp)) / "work"
        root.mkdir(parents=True)
        if a.scratch is not None:
            root.rmdir()
            shutil.copytree(shared_scratch(a.scratch.resolve(), a.code.resolve(), ckpt), root, symlinks=True)
        else:
            make_scratch(root, a.code.resolve(), ckpt)
        shutil.copytree(root, pristine(root), symlinks=True)
        rows = [run_probe(p, root, a.code.resolve(), a.timeout) for p in chosen]
    w = 44
    print(f"{'command | input':{w}} | exit | want | tb | files changed | last line")
    for r in rows:
        cmd = f"{r.probe.command} | {r.probe.what}"[:w]
        mark = "" if not r.broken else "   <-- " + "; ".join(r.broken)
        print(f"{cmd:{w}} | {r.exit:4} | {r.probe.code:4} | {'yes' if r.traceback else 'no ':3} | "
              f"{', '.join(r.changed)[:30]:30} | {r.last}{mark}")
    bad = [r for r in rows if r.broken]
    print(f"\n{len(rows)} probes, {len(bad)} broke a promise")
    return 1 if bad else 0


# ================================================================== issue 31, the device side (run.py, build_engine.sh,
# `vitdeploy info` on a bundle someone handed over): each case makes what a device copy can meet and checks the
# promise. `--device`: these cases only (their own table; about a minute).


_DEVICE_BUNDLE = r"""
import sys
from pathlib import Path
import numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
from vitdeploy.core.manifest import Manifest, set_onnx_manifest
from vitdeploy.core.preprocess import Preprocess
from vitdeploy.stages.bundle import BundleOptions, bundle
d = Path(sys.argv[1]); labels = sys.argv[2:] or list("abcde")
rng = np.random.default_rng(0)
inits = [numpy_helper.from_array(rng.normal(0, 0.02, (768, 5)).astype(np.float32), "W"),
         numpy_helper.from_array(np.ones(768, np.float32), "g"), numpy_helper.from_array(np.zeros(768, np.float32), "b")]
g = helper.make_graph([helper.make_node("Flatten", ["pixel_values"], ["f"], axis=1),
                       helper.make_node("LayerNormalization", ["f", "g", "b"], ["n"], axis=-1),
                       helper.make_node("MatMul", ["n", "W"], ["logits"])], "ln",
                      [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 16, 16])],
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 5])], inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
set_onnx_manifest(m, Manifest(model={"num_classes": 5, "image_size": [16, 16]}, labels=labels,
                              preprocess=Preprocess(input_size=(16, 16), resize_mode="squash").to_dict(), name="tiny",
                              precision="fp32"))
onnx.save(m, str(d / "model.onnx"))
bundle([d / "model.onnx"], d / "bundle", BundleOptions(references=4))
"""


def _device_bundle(work: Path, code: Path, *labels: str) -> subprocess.CompletedProcess[str]:
    """A no-target bundle in work/bundle of a small model with a LayerNormalization (TensorRT 8.5 gets a variant)."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    return subprocess.run([sys.executable, "-c", _DEVICE_BUNDLE, str(work), *labels], env=env, capture_output=True,
                          text=True, timeout=600, cwd=work)  # not the caller's folder: `-c` puts it before PYTHONPATH


def _sh(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 10.0) -> tuple[int, str, str, float]:
    t = time.monotonic()
    try:
        r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                           errors="backslashreplace")
        return r.returncode, r.stdout, r.stderr, time.monotonic() - t
    except subprocess.TimeoutExpired:
        return -9, "", f"(killed: still running after {timeout:g} s)", time.monotonic() - t


def _fake_trtexec(bindir: Path) -> dict[str, str]:
    bindir.mkdir(exist_ok=True)
    (bindir / "trtexec").write_text('#!/usr/bin/env bash\n[ "$1" = --help ] && exit 0\nfor a in "$@"; do case "$a" in '
                                    '--saveEngine=*) echo plan > "${a#--saveEngine=}" ;; esac; done\n')
    (bindir / "trtexec").chmod(0o755)
    return {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}


def _one_line(rc: int, err: str) -> str | None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if rc == -9:
        return "hung"
    if "Traceback" in err:
        return "traceback"
    return None if rc in (0, 3) or len(lines) == 1 else f"{len(lines)} lines on stderr"


def device_probes(work: Path, code: Path) -> list[tuple[str, str, str | None]]:
    """(case, what happened, broken promise or None) for each device-side case of issue 31."""
    _device_bundle(work, code).check_returncode()
    made = work / "bundle"
    py, rows = sys.executable, []
    noenv = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def fresh(name: str) -> Path:
        b = work / name
        shutil.copytree(made, b, symlinks=True)
        return b

    # 1. the engine build_engine.sh writes is the one run.py --check names
    for v in ("8.5", "8.6", "10.3", "11.4"):
        b = fresh(f"engine{v}")
        env = _fake_trtexec(work / "bin")
        rc, out, err, _ = _sh(["bash", "build_engine.sh", "--trt", v], b, env, 60)
        wrote = next((ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("wrote ")), "?")
        rc, out, err, _ = _sh([py, "run.py", "--check"], b, noenv, 60)
        said = (out + err).strip().splitlines()[-1:] or [""]
        rows.append((f"run.py --check after build_engine.sh --trt {v}", said[0][:70],
                     None if wrote in out + err else f"does not name {wrote}"))
    # 4. --model outside the bundle: the file hashed must be the file run
    b = fresh("outside")
    (work / "other").mkdir(exist_ok=True)
    shutil.copy(b / "model.raw.onnx", work / "other" / "model.raw.onnx")
    rc, out, err, _ = _sh([py, "run.py", "--model", "../other/model.raw.onnx", "--check", "--backend", "onnxruntime"],
                          b, noenv, 60)
    rows.append(("run.py --model ../other/model.raw.onnx --check", (out + err).strip()[:70],
                 "ran a file outside the bundle" if rc == 0 else _one_line(rc, err)))
    # 5. a planted <engine>.dla symlink
    b = fresh("dla")
    victim = work / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, b / "model.raw.engine.dla")
    rc, out, err, _ = _sh(["bash", "build_engine.sh", "--trt", "10.3", "--dla", "0"], b, _fake_trtexec(work / "bin"), 60)
    rows.append(("build_engine.sh --dla 0, <engine>.dla a symlink", (err or out).strip()[-70:],
                 "wrote through the symlink" if victim.read_text() != "precious\n" else None))
    # 6. manifest.json lists /usr, ../x, a FIFO, /dev/zero: run.py --check and vitdeploy info, one line in < 2 s
    for entry in ("/usr", "../x", "fifo", "/dev/zero", "/etc/hostname"):
        b = fresh(f"entry{len(rows)}")
        (b.parent / "x").write_text("outside\n")
        if entry == "fifo":
            os.mkfifo(b / "fifo")
        man = json.loads((b / "manifest.json").read_text())
        man["bundle"]["artifacts"][entry] = {"precision": "fp32", "sha256": "0" * 64}
        (b / "manifest.json").write_text(json.dumps(man))
        for name, argv, env in (("run.py --check", [py, "run.py", "--check"], noenv),
                                ("vitdeploy info", [py, "-m", "vitdeploy", "info", str(b)],
                                 {**os.environ, "PYTHONPATH": str(code)})):
            rc, out, err, took = _sh(argv, b, env, 20)
            bad = _one_line(rc, err) or (None if rc == 1 else f"exit {rc}, a bad entry taken")
            if not bad and "SHA-256" in err:  # it hashed the entry: a read outside the bundle
                bad = "read the entry (hashed it)"
            rows.append((f"{name}, manifest lists {entry}", f"{took:.1f} s: " + (err.strip()[-60:] or out[:60]),
                         bad))
    # 6. labels.txt a FIFO (run.py --check counts its lines)
    b = fresh("labelsfifo")
    (b / "labels.txt").unlink()
    os.mkfifo(b / "labels.txt")
    rc, out, err, took = _sh([py, "run.py", "--check", "--backend", "onnxruntime"], b, noenv, 20)
    rows.append(("run.py --check, labels.txt a FIFO", f"{took:.1f} s: " + (err.strip()[-60:] or out[:60]),
                 _one_line(rc, err) or (None if rc == 1 else f"exit {rc}")))
    # 9. labels with characters str.splitlines() breaks on: bundle refuses (or run.py still counts right)
    w9 = work / "labels9"
    w9.mkdir()
    try:
        r = _device_bundle(w9, code, "a", "b\u2028c", "d", "e\x85f", "g")
        if r.returncode == 0:
            rc, out, err, _ = _sh([py, "run.py", "--check", "--backend", "onnxruntime"], w9 / "bundle", noenv, 60)
            rows.append(("bundle + run.py --check, labels with \\u2028 \\x85", (err or out).strip()[:70],
                         None if rc == 0 else f"bundle exit 0, run.py exit {rc}"))
        else:
            last = r.stderr.strip().splitlines()[-1:] or [""]
            rows.append(("bundle, labels with \\u2028 \\x85", last[0][:70],
                         "traceback" if "Traceback" in r.stderr and "VitdeployError" not in r.stderr else None))
    except subprocess.TimeoutExpired:
        rows.append(("bundle, labels with \\u2028 \\x85", "hung", "hung"))
    # 14. run.py --help without Pillow
    b = fresh("nopil")
    (work / "nopil" / "PIL").mkdir(parents=True)
    (work / "nopil" / "PIL" / "__init__.py").write_text("raise ImportError('No module named PIL')\n")
    rc, out, err, _ = _sh([py, "run.py", "--help"], b, {**noenv, "PYTHONPATH": str(work / "nopil")}, 60)
    rows.append(("run.py --help without Pillow", (err.strip().splitlines() or [out[:60]])[-1][:70],
                 "traceback" if "Traceback" in err else (None if rc == 0 else f"exit {rc}")))
    # 8 (run.py's side). a file name with a terminal escape
    b = fresh("names")
    (work / "imgs").mkdir(exist_ok=True)
    shutil.copy(next((b / "reference" / "images").iterdir()), work / "imgs" / "a\x1b[2Jb.png")
    rc, out, err, _ = _sh([py, "run.py", str(work / "imgs"), "--backend", "onnxruntime"], b, noenv, 60)
    rows.append(("run.py IMAGES, a file name with ESC[2J", out.strip()[:70].encode("unicode_escape").decode(),
                 "printed the escape raw" if "\x1b" in out + err else _one_line(rc, err)))
    return rows


def main_device(code: Path, keep: Path | None) -> int:
    with tempfile.TemporaryDirectory(prefix="vitdeploy-probe-device-") as tmp:
        work = (keep if keep else Path(tmp)) / "device"
        work.mkdir(parents=True)
        rows = device_probes(work, code)
    w = 52
    print(f"{'case':{w}} | broken? | what happened")
    for case, what, broken in rows:
        print(f"{case[:w]:{w}} | {'YES' if broken else 'no ':7} | {what}" + (f"   <-- {broken}" if broken else ""))
    bad = [r for r in rows if r[2]]
    print(f"\n{len(rows)} device probes, {len(bad)} broke a promise")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
