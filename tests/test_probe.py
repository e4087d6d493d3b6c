"""The fast part of scripts/probe_bad_inputs.py: every command with bad input keeps the project's promises.

(Issues 15 and 23: one line, the documented exit code, no traceback, nothing written outside the output, special
files written in place, NaN never a pass, byte file names, benchmark bounds. The full run,
with the slower probes, is by hand: `.venv/bin/python scripts/probe_bad_inputs.py`.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "probe_bad_inputs.py"


def test_fast_probes_keep_every_promise() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--fast"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "0 broke a promise" in r.stdout and int(r.stdout.split(" probes,")[0].split()[-1]) >= 60, r.stdout[-500:]
