"""infer SOURCE -o DIR/: a corpus into Parquet shards, in-process and on Ray Data, resumable (issue 41, items 1-3).

The corpus is the digits val split (100 images, an ImageFolder of 10 classes) plus files that cannot be read; the
model is the session's digits ViT exported as an embedding model the way a user exports it. Every figure is checked
against an independent path: today's `infer -o FILE.npy` (the vectors with their .files.txt), pyarrow's own reader,
hashlib over the model file. The Ray tests are `slow` (a Ray takes 6-8 s to start on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vitdeploy.cli import app

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

cli = CliRunner()
UNREADABLE = {"3/garbage.png": b"not an image at all", "5/empty.jpg": b""}


def run(*args: str) -> tuple[int, str]:
    r = cli.invoke(app, list(args))
    assert "Traceback" not in r.output, r.output
    return r.exit_code, r.output


def refused(code: int, *args: str) -> str:
    """A bad input: the exit code and one line of error; returns the line."""
    rc, out = run(*args)
    assert rc == code, (args, out)
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, out
    return errors[0]


@pytest.fixture(scope="module")
def emb(digits_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits ViT as an L2-normalised embedding model (`make demo`'s embed.onnx)."""
    d = tmp_path_factory.mktemp("corpus-model")
    ck = shutil.copy(digits_ckpt, d / "ckpt.pth")
    rc, out = run("export", str(ck), "--embedding", "--normalize", "-o", str(d / "embed.onnx"), "--no-check")
    assert rc == 0, out
    return d / "embed.onnx"


@pytest.fixture(scope="module")
def corpus(digits_val10: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """100 digit PNGs in 10 class folders, one truncated PNG and two files that are no image."""
    root = tmp_path_factory.mktemp("corpus") / "images"
    shutil.copytree(digits_val10, root)
    for name, data in UNREADABLE.items():
        (root / name).write_bytes(data)
    first = sorted((root / "7").iterdir())[0]
    (first.parent / "cut.png").write_bytes(first.read_bytes()[:60])
    return root


def read_shards(folder: Path) -> tuple[list[dict], dict[str, np.ndarray], list[int]]:
    """Each shard's metadata, all rows (id, path, class, embedding) in shard order, and the rows per shard."""
    metas, per, cols = [], [], {"id": [], "path": [], "embedding": [], "class": []}
    for f in sorted(folder.glob("part-*.parquet")):
        t = pq.read_table(f)
        metas.append(json.loads(t.schema.metadata[b"vitdeploy"]))
        per.append(t.num_rows)
        cols["id"] += t.column("id").to_pylist()
        cols["path"] += t.column("path").to_pylist()
        cols["class"] += t.column("class").to_pylist() if "class" in t.column_names else []
        cols["embedding"].append(t.column("embedding").combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1))
    out = {k: (np.concatenate(v) if k == "embedding" else np.asarray(v)) for k, v in cols.items()}
    return metas, out, per


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def stat_of(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in sorted(folder.glob("part-*.parquet"))}


def closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_shards_hold_every_readable_image_once_with_todays_vectors(emb: Path, corpus: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{closed_port()}")  # the variable alone never switches executors
    out = tmp_path / "emb"
    rc, text = run("infer", str(corpus), "-m", str(emb), "--backend", "onnxruntime", "-o", f"{out}/",
                   "--shard-size", "30")
    assert rc == 3, text  # unreadable files: partly done
    assert "4 shard(s)" in text and "3 unreadable file(s) listed in" in text, text
    rc, text = run("infer", str(corpus), "-m", str(emb), "--backend", "onnxruntime", "-o", str(tmp_path / "e.npy"))
    assert rc == 3, text
    want = np.load(tmp_path / "e.npy")
    want_paths = (tmp_path / "e.files.txt").read_text().splitlines()

    metas, rows, per = read_shards(out)
    assert [f.name for f in sorted(out.glob("part-*"))] == [f"part-0000{i}.parquet" for i in range(4)]
    assert list(rows["path"]) == want_paths  # the same rows, in the same order
    assert np.abs(unit(rows["embedding"]) - unit(want)).max() <= 1e-6
    assert sorted(rows["id"]) == list(rows["id"]) and len(set(rows["id"])) == len(rows["id"])
    assert [Path(p).parent.name for p in rows["path"]] == list(rows["class"])  # an ImageFolder: its classes
    t = pq.read_table(out / "part-00000.parquet")
    assert t.schema.field("id").type == pa.int64()
    assert t.schema.field("embedding").type == pa.list_(pa.float32(), 96)

    errors = pq.read_table(out / "errors.parquet").to_pylist()
    assert sorted(Path(e["path"]).name for e in errors) == ["cut.png", "empty.jpg", "garbage.png"]
    assert all(e["reason"] for e in errors)
    assert len(rows["id"]) + len(errors) == 103 and sum(per) == 100 and set(rows["id"]) < set(range(103))
    assert not {e["path"] for e in errors} & set(rows["path"])
    sha = hashlib.sha256(emb.read_bytes()).hexdigest()
    ck = hashlib.sha256((emb.parent / "ckpt.pth").read_bytes()).hexdigest()
    for i, m in enumerate(metas):
        assert m["model"]["sha256"] == sha and m["model"]["checkpoint"] == ck
        assert m["partition"]["index"] == i and m["rows"] == per[i]
        assert m["rows"] + m["skipped"] == (30 if i < 3 else 13)
        assert m["host"] == socket.gethostname() and m["seconds"] >= 0 and len(m["partition"]["source_hash"]) == 64
        assert m["node"] is None  # made in-process, RAY_ADDRESS notwithstanding


def test_a_rerun_keeps_finished_shards_remakes_changed_and_truncated_ones(emb: Path, corpus: Path,
                                                                          tmp_path: Path) -> None:
    images = tmp_path / "images"
    shutil.copytree(corpus, images)
    out = tmp_path / "emb"
    args = ("infer", str(images), "-m", str(emb), "--backend", "onnxruntime", "-o", f"{out}/", "--shard-size", "25")
    assert run(*args)[0] == 3
    before = stat_of(out)
    time.sleep(0.02)
    part1 = out / "part-00001.parquet"  # a crash's truncated copy (as a copy by other means would leave it)
    part1.write_bytes(before[part1.name][0][: len(before[part1.name][0]) // 2])
    victim = sorted(images.rglob("*.png"))[-1]  # the last partition's image changes
    os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 10**9))
    rc, text = run(*args)
    assert rc == 3, text  # errors.parquet still lists the unreadable files of the kept shards
    after = stat_of(out)
    assert after["part-00000.parquet"] == before["part-00000.parquet"]  # bytes and mtime
    assert after["part-00002.parquet"] == before["part-00002.parquet"]
    assert pq.read_table(part1).num_rows == json.loads(pq.read_schema(part1).metadata[b"vitdeploy"])["rows"] > 0
    assert after["part-00004.parquet"][1] != before["part-00004.parquet"][1]  # the changed image's shard: made again
    assert "2 made" in text and "3 kept" in text, text
    _, rows, _ = read_shards(out)
    assert len(rows["id"]) == len(set(rows["id"])) == 100
    assert len(pq.read_table(out / "errors.parquet")) == 3

    # a smaller source: the shards past its end are removed, and the run says so
    shutil.rmtree(images / "9")  # 103 - 20 files: 4 partitions of 25 where there were 5
    shutil.rmtree(images / "8")
    rc, text = run(*args)
    assert "removed 1 shard(s) that match no partition" in text and "part-00004.parquet" in text, text
    assert not (out / "part-00004.parquet").exists()


def test_txt_and_parquet_sources_keep_their_order_and_a_pathless_parquet_is_one_line(emb: Path, corpus: Path,
                                                                                   tmp_path: Path) -> None:
    files = sorted(corpus.rglob("*.png"))[:12][::-1]  # a listed order that is not the sorted one
    lst = tmp_path / "list" / "images.txt"
    lst.parent.mkdir()
    lst.write_text("".join(os.path.relpath(f, lst.parent) + "\n" for f in files))
    assert run("infer", str(lst), "-m", str(emb), "--backend", "onnxruntime", "-o", f"{tmp_path / 'a'}/",
               "--shard-size", "5")[0] in (0, 3)
    _, rows, per = read_shards(tmp_path / "a")
    assert [os.path.realpath(p) for p in rows["path"]] == [os.path.realpath(f) for f in files]
    assert list(rows["id"]) == list(range(12)) and len(per) == 3
    assert len(rows["class"]) == 0  # a list is no ImageFolder

    table = tmp_path / "list" / "images.parquet"
    pq.write_table(pa.table({"path": [os.path.relpath(f, table.parent) for f in files], "note": ["x"] * 12}), str(table))
    assert run("infer", str(table), "-m", str(emb), "--backend", "onnxruntime", "-o", f"{tmp_path / 'b'}/",
               "--shard-size", "5")[0] in (0, 3)
    assert np.array_equal(read_shards(tmp_path / "b")[1]["embedding"], rows["embedding"])

    bad = tmp_path / "list" / "nopath.parquet"
    pq.write_table(pa.table({"file": ["a.png"]}), str(bad))
    line = refused(2, "infer", str(bad), "-m", str(emb), "-o", f"{tmp_path / 'c'}/")
    assert "nopath.parquet" in line and "no `path` column" in line and "file" in line
    assert not (tmp_path / "c").exists()


def _other_checkpoint(ckpt: Path, dest: Path) -> Path:
    """The digits checkpoint with one weight changed: another checkpoint of the same model."""
    import torch

    obj = torch.load(ckpt, map_location="cpu", weights_only=False)
    name = next(iter(obj["state_dict"]))
    obj["state_dict"][name] = obj["state_dict"][name] + 0.01
    torch.save(obj, dest)
    return dest


def test_another_checkpoints_shards_are_refused_and_kept(digits_onnx: Path, digits_ckpt: Path, corpus: Path,
                                                         tmp_path: Path) -> None:
    out = tmp_path / "labels"
    rc, text = run("infer", str(corpus), "-m", str(digits_onnx), "--backend", "onnxruntime", "-o", f"{out}/",
                   "--shard-size", "50", "-k", "3")
    assert rc == 3, text
    t = pq.read_table(out / "part-00000.parquet")  # a classifier's shard: label, score and the top-k
    assert {"label", "score", "label_1", "score_1", "label_3", "score_3"} <= set(t.column_names)
    assert t.column("label").to_pylist() == t.column("label_1").to_pylist()
    before = stat_of(out)
    other = _other_checkpoint(digits_ckpt, tmp_path / "other.pth")
    line = refused(2, "infer", str(corpus), "-m", str(other), "-o", f"{out}/", "--shard-size", "50")
    assert "another model" in line and "--force" in line
    assert stat_of(out) == before
    rc, text = run("infer", str(corpus), "-m", str(other), "-o", f"{out}/", "--shard-size", "50", "--force")
    assert rc == 3, text
    ck = hashlib.sha256(other.read_bytes()).hexdigest()
    assert all(json.loads(pq.read_schema(f).metadata[b"vitdeploy"])["model"]["checkpoint"] == ck
               for f in out.glob("part-*.parquet"))


def test_ray_options_are_refused_without_a_shard_folder_and_an_unreachable_cluster_writes_nothing(
        emb: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = refused(2, "infer", str(corpus), "-m", str(emb), "--ray", "-o", str(tmp_path / "e.npy"))
    assert "--ray" in line and "-o DIR/" in line
    pytest.importorskip("ray")
    port = closed_port()
    t0 = time.monotonic()
    line = refused(1, "infer", str(corpus), "-m", str(emb), "-o", f"{tmp_path / 'x'}/", "--ray-address",
                   f"127.0.0.1:{port}")
    assert time.monotonic() - t0 < 60
    assert f"127.0.0.1:{port}" in line and "ray start --head" in line
    assert not (tmp_path / "x").exists()

    from vitdeploy.core.errors import VitdeployError
    from vitdeploy.tools.corpus.ray_exec import resolve_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolve_address(None) == "local"  # --ray alone: a new local Ray, never ray.init()'s guess
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(VitdeployError, match="RAY_ADDRESS 127.0.0.1"):  # --ray joins the variable's cluster
        resolve_address(None)


def test_a_gpu_model_asks_ray_for_a_gpu_and_two_cores_leave_the_reader_a_cpu(tmp_path: Path) -> None:
    from vitdeploy.tools.corpus.ray_exec import actor_resources, model_stage_request, uses_gpu

    engine = tmp_path / "model.int8.engine"
    gpu = actor_resources(16, 2, uses_gpu(engine, "auto"))
    assert model_stage_request(gpu)["num_gpus"] == 1 and gpu.actors == 2
    assert uses_gpu(tmp_path / "m.onnx", "onnxruntime", ["CUDAExecutionProvider", "CPUExecutionProvider"])
    cpu = actor_resources(2, 0, uses_gpu(tmp_path / "m.onnx", "onnxruntime"))
    assert "num_gpus" not in model_stage_request(cpu)
    # two 1-CPU actors on 2 cores starve the read task for ever: the actors share what the readers leave
    assert cpu.actors * cpu.num_cpus + cpu.read_cpus <= 2 - cpu.read_cpus + 1e-9 and cpu.num_cpus < 1
    assert cpu.threads == 1
    assert actor_resources(1, 0, False).num_cpus <= 0.5


# --- Ray (slow: a Ray takes 6-8 s to start on 2 cores) ----------------------------------------------------------------


@pytest.mark.slow
def test_ray_makes_the_same_shards_as_in_process(emb: Path, corpus: Path, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    a, b = tmp_path / "inproc", tmp_path / "ray"
    for out, extra in ((a, ()), (b, ("--ray",))):
        rc, text = run("infer", str(corpus), "-m", str(emb), "--backend", "onnxruntime", "-o", f"{out}/",
                       "--shard-size", "30", *extra)
        assert rc == 3, text
    ma, ra, pa_ = read_shards(a)
    mb, rb, pb = read_shards(b)
    assert pa_ == pb and list(ra["id"]) == list(rb["id"]) and list(ra["path"]) == list(rb["path"])
    assert np.abs(unit(ra["embedding"]) - unit(rb["embedding"])).max() <= 1e-6
    assert all(len(m["node"]) == 56 for m in mb) and all(m["node"] is None for m in ma)  # Ray's node id (hex)
    assert pq.read_table(a / "errors.parquet").equals(pq.read_table(b / "errors.parquet"))


@pytest.mark.slow
def test_two_ray_nodes_both_make_shards(emb: Path, corpus: Path, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from vitdeploy.tools.corpus.run import infer_corpus

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        res = infer_corpus([corpus], tmp_path / "emb", emb, backend="onnxruntime", batch_size=2, shard_size=10,
                           ray_address=cluster.address)
    finally:
        cluster.shutdown()
    assert res.made == 11 and res.rows == 100
    metas, rows, _ = read_shards(tmp_path / "emb")
    assert len({m["node"] for m in metas}) == 2, [m["node"] for m in metas]
    assert list(rows["id"]) == sorted(set(rows["id"]))


@pytest.mark.slow
def test_resume_after_sigkill_keeps_finished_shards(emb: Path, corpus: Path, tmp_path: Path) -> None:
    """The driver killed once half the shards exist; the same command again makes the rest, each image once."""
    out = tmp_path / "emb"
    cmd = [sys.executable, "-m", "vitdeploy", "infer", str(corpus), "-m", str(emb), "--backend", "onnxruntime",
           "-o", f"{out}/", "--shard-size", "10", "--batch-size", "1", "--threads", "1", "--workers", "1"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while p.poll() is None and len(list(out.glob("part-*.parquet"))) < 5:
            time.sleep(0.01)
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait()
    assert p.returncode == -signal.SIGKILL, "the run ended before half its shards were written: make it slower"
    before = stat_of(out)
    assert 5 <= len(before) < 11
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    after = stat_of(out)
    assert all(after[k] == v for k, v in before.items())  # bytes and mtime
    _, rows, _ = read_shards(out)
    assert len(rows["id"]) == len(set(rows["id"])) == 100 and len(after) == 11
    assert not [f for f in out.iterdir() if f.name.startswith(".")]  # no temporary file left behind


# A subreaper (Linux's PR_SET_CHILD_SUBREAPER) runs the command: every process the command starts, however it
# detaches (a daemon's double fork, setsid), is re-parented to it when its parent exits, so the processes still alive
# after the command are exactly its children, and nobody else's process is looked at. It prints them as JSON: those
# alive the moment the command exits, and those still alive after a grace of GRACE seconds (then killed, by pid).
SUBREAPER = r"""
import ctypes, json, os, signal, subprocess, sys, time

GRACE = float(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(36, 1, 0, 0, 0) == 0, ctypes.get_errno()  # PR_SET_CHILD_SUBREAPER


def alive():
    while True:  # the exited orphans are this process's zombies now: reap them
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    out = {}
    for task in os.listdir("/proc/self/task"):
        try:
            kids = open(f"/proc/self/task/{task}/children").read().split()
        except OSError:
            continue
        for k in kids:
            try:
                name = open(f"/proc/{k}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            out[k] = name[:160]
    return out


rc = subprocess.call(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
at_exit = alive()
t0 = time.monotonic()
left = at_exit
while left and time.monotonic() - t0 < GRACE:
    time.sleep(0.2)
    left = alive()
for pid in left:
    os.kill(int(pid), signal.SIGKILL)
print(json.dumps({"rc": rc, "at_exit": at_exit, "after_grace": left, "grace_s": round(time.monotonic() - t0, 1)}))
"""


def survivors(cmd: list[str], grace: float) -> dict:
    """Run ``cmd`` under the subreaper; what it reports (the command's exit code and the processes it left)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run([sys.executable, "-c", SUBREAPER, str(grace), *cmd], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER and /proc are Linux's")
def test_no_ray_process_outlives_the_command(emb: Path, corpus: Path, tmp_path: Path) -> None:
    """`infer --ray` starts a local Ray (gcs_server, raylet, workers, agents): none of them is alive once the
    command has exited, beyond the few seconds a process takes to die of its parent's SIGTERM."""
    pytest.importorskip("ray")
    # the watcher sees what a command leaves: a daemon that outlives its parent is reported
    left = survivors(["sh", "-c", "sleep 30 & exit 0"], grace=1.0)
    assert [v for v in left["after_grace"].values() if v.startswith("sleep 30")], left
    out = tmp_path / "emb"
    got = survivors([sys.executable, "-m", "vitdeploy", "infer", str(corpus), "-m", str(emb), "--backend",
                     "onnxruntime", "-o", f"{out}/", "--shard-size", "30", "--ray"], grace=10.0)
    assert got["rc"] == 3, got  # three unreadable files listed
    assert len(list(out.glob("part-*.parquet"))) == 4  # it did run on Ray
    assert got["after_grace"] == {}, got


@pytest.mark.slow
def test_a_cluster_that_asks_for_a_token_is_said_so_in_one_line(emb: Path, corpus: Path, tmp_path: Path) -> None:
    """Ray 2.60's `ray start --head` turns token authentication on where a token exists; a driver joining by address
    without RAY_AUTH_MODE=token was told only "Failed to connect": the line names the cause and the fix."""
    pytest.importorskip("ray")
    import secrets
    import tempfile

    port = closed_port()
    short = Path(tempfile.mkdtemp(prefix="vdr", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    head_env = {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "HOME": str(short),
                "RAY_USAGE_STATS_ENABLED": "0"}
    ray_cli = str(Path(sys.executable).with_name("ray"))
    head = subprocess.Popen([ray_cli, "start", "--head", "--block", "--port", str(port), "--num-cpus", "1",
                             "--include-dashboard", "false", "--temp-dir", str(short / "t")], env=head_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert head.poll() is None, "ray start --head exited"
            time.sleep(0.5)
        env = {**base, "HOME": str(short), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        r = subprocess.run([sys.executable, "-m", "vitdeploy", "infer", str(corpus), "-m", str(emb), "-o",
                            f"{tmp_path / 'emb'}/", "--ray-address", f"127.0.0.1:{port}"], env=env,
                           capture_output=True, text=True, timeout=300)
    finally:
        head.terminate()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        shutil.rmtree(short, ignore_errors=True)
    assert r.returncode == 1, r.stderr
    errors = [ln for ln in r.stderr.splitlines() + r.stdout.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "RAY_AUTH_MODE=token" in errors[0] and f"127.0.0.1:{port}" in errors[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "emb").exists()  # nothing written, not even DIR
