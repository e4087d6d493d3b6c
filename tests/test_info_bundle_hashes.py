"""`vitdeploy info BUNDLE` checks every file manifest.json lists against its SHA-256 before calling anything
current (issue 40, E and mechanism 4): a model or reference file that changed or is missing fails (exit 1) naming
it; a file a user may edit (README, Triton and DeepStream configs) that changed is named as edited, a warning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vitdeploy.cli import app

cli = CliRunner()


@pytest.fixture
def bundle_copy(digits_bundle: Path, tmp_path: Path) -> Path:
    out = tmp_path / "b"
    shutil.copytree(digits_bundle, out)
    return out


def _info(b: Path, *extra: str):  # noqa: ANN202 - click's Result
    return cli.invoke(app, ["info", str(b), *extra])


def test_info_on_an_untouched_bundle_is_current(bundle_copy: Path) -> None:
    r = _info(bundle_copy, "--json", "-")
    assert r.exit_code == 0, r.output
    (doc,) = json.loads(r.stdout)
    listed = json.loads((bundle_copy / "manifest.json").read_text())["bundle"]["files"]
    states = {lk["source"]: lk["state"] for lk in doc["files"]}
    assert set(listed) <= set(states) and set(states.values()) == {"current"} and doc["current"] is True
    assert any(n.startswith("reference/") for n in states)  # the references are checked, not only the models


@pytest.mark.parametrize("how", ["scaled", "float16", "missing"])
def test_a_changed_reference_file_fails_naming_it(bundle_copy: Path, how: str) -> None:
    ref = json.loads((bundle_copy / "manifest.json").read_text())["bundle"]["reference"]
    name = sorted(ref["logits"].values())[0]
    f = bundle_copy / name
    if how == "missing":
        f.unlink()
    else:
        a = np.load(f)
        np.save(f, a * 1000 if how == "scaled" else a.astype(np.float16))  # what run.py --check would read
    r = _info(bundle_copy)
    assert r.exit_code == 1, r.output
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and name in errors[0] and "Traceback" not in r.output, r.output
    assert ("is missing" if how == "missing" else "SHA-256 differs") in errors[0]
    r = _info(bundle_copy, "--json", "-")  # the JSON still comes (strict, on stdout), and the exit code says it
    assert r.exit_code == 1
    (doc,) = json.loads(r.stdout)
    assert doc["current"] is False
    assert {lk["source"]: lk["state"] for lk in doc["files"]}[name] == ("missing" if how == "missing" else "stale")


def test_an_edited_config_is_a_warning_not_a_failure(bundle_copy: Path) -> None:
    m = json.loads((bundle_copy / "manifest.json").read_text())
    pbtxt = m["bundle"]["triton"]["model"].rsplit("/1/", 1)[0] + "/config.pbtxt"
    with open(bundle_copy / pbtxt, "a") as fh:
        fh.write("\n# instance_group edited for this server\n")
    with open(bundle_copy / "README.md", "a") as fh:
        fh.write("\nnotes of mine\n")
    r = _info(bundle_copy)
    assert r.exit_code == 0, r.output
    assert f"warning: {bundle_copy / pbtxt} was edited since the bundle was packed" in r.output
    assert f"warning: {bundle_copy / 'README.md'} was edited" in r.output
    assert f"edited: {pbtxt} changed since the bundle was packed" in r.output
