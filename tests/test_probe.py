"""The fast part of scripts/probe_bad_inputs.py: every command with bad input keeps the project's promises.

(Issues 15 and 23: one line, the documented exit code, no traceback, nothing written outside the output, special
files written in place, NaN never a pass, byte file names, benchmark bounds. Issue 37: hostile Hugging Face and timm
folders, import's outputs and special-file options, bundle's checks before work, run.py's reads. The full run,
with the slower probes, is by hand: `.venv/bin/python scripts/probe_bad_inputs.py`.)

The probes run in SHARDS tests (probe k in shard k % SHARDS), so pytest-xdist spreads them over its workers; they
probe the session's digits checkpoint (a copy) in a scratch folder made once and cached like the digits artifacts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# `make test` leaves these out (`make test-all` and CI run them): every fast probe of scripts/probe_bad_inputs.py, each a CLI process, over a scratch folder of real models (127 test-s of the fast set's 920)
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "probe_bad_inputs.py"
SHARDS = 4
FAST = 116  # fast probes in all, at least (issue 37 brought them from 79 to 97, issue 40 to 116)
AT_LEAST = FAST // SHARDS - 1  # probes per shard


def _count(*args: str) -> int:
    """How many fast probes the script would run with ``args`` (it runs none)."""
    r = subprocess.run([sys.executable, str(SCRIPT), "--fast", "--count", *args], capture_output=True, text=True,
                       timeout=60, check=True)
    return int(r.stdout)


def test_the_shards_cover_every_fast_probe() -> None:
    shards = [_count("--shard", f"{i}/{SHARDS}") for i in range(SHARDS)]
    assert sum(shards) == _count() >= FAST and min(shards) >= AT_LEAST, shards
    assert _count("--only", "run.py") >= 3 and _count("--only", "HF") >= 3, "issue 37's probes are in the fast set"
    for family in "ABCDEFGH":  # issue 40: one of each family (A another checkpoint's model ... H messages)
        assert _count("--only", f"{family}:") >= 1, f"issue 40's family {family} has no fast probe"


@pytest.fixture(scope="session")
def probe_scratch(digits_ckpt: Path) -> Path:
    """The script's --scratch folder, made once on the digits checkpoint for every worker and run (tests/
    artifact_cache.py); each shard probes a copy of it."""
    import artifact_cache

    return artifact_cache.probe_scratch_entry()


@pytest.mark.parametrize("shard", range(SHARDS))
def test_fast_probes_keep_every_promise(shard: int, digits_ckpt: Path, probe_scratch: Path) -> None:
    which = f"{shard}/{SHARDS}"
    r = subprocess.run([sys.executable, str(SCRIPT), "--fast", "--shard", which, "--ckpt", str(digits_ckpt),
                        "--scratch", str(probe_scratch)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    ran = int(r.stdout.split(" probes,")[0].split()[-1])
    assert "0 broke a promise" in r.stdout and ran == _count("--shard", which) >= AT_LEAST, r.stdout[-500:]
