"""Many `vitdeploy ARGS` cases run in one fresh process (not a test module: test modules import it).

Each case goes through ``vitdeploy.__main__.main(argv)``, the function the ``vitdeploy`` console script calls, in
the folder given: its exit code, stdout and stderr, the files of that folder compared before and after, the time it
took, and the modules imported by then (the process is fresh: what the cases so far needed). One process for many
refusals: a refusal costs about 0.15-0.25 CPU-s as its own process (the interpreter and the CLI's imports), a few
milliseconds here. The real process and its exit status are what ``scripts/probe_bad_inputs.py``
(``tests/test_probe.py``) checks.

    python tests/cli_cases.py < cases.json    # what run_cli_cases starts: one JSON row per case on stdout
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CliCase:
    argv: list[str]
    code: int
    stdout: str
    stderr: str
    seconds: float
    changed: list[str]  # files and folders under the folder that appeared, went or changed
    modules: list[str]  # every module imported by the end of this case (by it or by an earlier case)

    def lines(self) -> list[str]:
        """The non-blank lines on stderr."""
        return [ln for ln in self.stderr.splitlines() if ln.strip()]

    def loaded(self, *names: str) -> list[str]:
        """Which of these modules or packages (a package with any of its modules) had been imported."""
        return sorted({n for n in names for m in self.modules if m == n or m.startswith(n + ".")})


def run_cli_cases(cases: Sequence[Sequence[str]], cwd: Path, timeout: float = 300) -> list[CliCase]:
    """Run each ``vitdeploy ARGS`` of ``cases`` in ``cwd``, in order, all in one fresh Python process."""
    r = subprocess.run([sys.executable, __file__], input=json.dumps([list(c) for c in cases]), cwd=cwd,
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"the case runner failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    rows = [CliCase(**json.loads(line)) for line in r.stdout.splitlines()]
    if len(rows) != len(cases):
        raise RuntimeError(f"{len(cases)} cases, {len(rows)} results:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return rows


def _snapshot(root: Path) -> dict[str, tuple[bool, int, int]]:
    """Every path under ``root`` (links not followed): is it a folder, its size and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (name in dirnames, st.st_size, st.st_mtime_ns)
    return out


def _main() -> None:
    cases = json.loads(sys.stdin.read())
    out = sys.stdout
    from vitdeploy.__main__ import main

    root = Path.cwd()
    for argv in cases:
        before = _snapshot(root)
        err, std = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
            try:
                code = main(argv)
            except SystemExit as e:  # a command that exits instead of returning: its status, as the script's
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        took = time.perf_counter() - t0
        after = _snapshot(root)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        row = {"argv": argv, "code": code, "stdout": std.getvalue(), "stderr": err.getvalue(), "seconds": took,
               "changed": changed, "modules": sorted(sys.modules)}
        out.write(json.dumps(row) + "\n")
        out.flush()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's vitdeploy
    _main()
