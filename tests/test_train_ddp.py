"""Training under torchrun (DDP, gloo on CPU), mixed precision and accumulation options, and train's bad input.

The torchrun runs use the embedded digits set at 16x16 with 4x4 patches for 2 epochs (a few seconds each).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.preprocess import Preprocess
from vitdeploy.model.checkpoint import load_checkpoint
from vitdeploy.model.data import Split, load_digits_dataset
from vitdeploy.model.train import Dist, TrainOptions, evaluate, partial_path, train, train_step
from vitdeploy.model.vit import VisionTransformer, ViTConfig, get_preset

# `make test` leaves these out (`make test-all` and CI run them): torchrun with several processes (86 test-s of 3500 under load)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = ["--image-size", "16", "--patch-size", "4", "--epochs", "2", "--batch-size", "32"]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible here)")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"  # one thread per process: 2 processes on 2 cores
    return env


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    """In-process training on one thread: two threads on a shared 2-core machine can run 10x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _torchrun(args: list[str], cwd: Path, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "torchrun"), "--nproc-per-node", str(nproc), "--master-port", str(_free_port()), "-m", "vitdeploy", "train", *args]
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`torchrun --nproc-per-node 2 -m vitdeploy train` on digits: (checkpoint, stdout)."""
    work = tmp_path_factory.mktemp("ddp")
    (work / "out").mkdir()
    r = _torchrun([*TINY, "-o", "out/ckpt.pth"], work)
    assert r.returncode == 0, r.stderr[-3000:]
    return work / "out" / "ckpt.pth", r.stdout


def _val_logits(ckpt: Path) -> tuple[torch.Tensor, np.ndarray, float]:
    ck = load_checkpoint(ckpt)
    model = ck.build()
    pp = Preprocess.from_dict(ck.manifest.preprocess)
    val = load_digits_dataset(pp).val
    with torch.inference_mode():
        logits = model(torch.from_numpy(val.arrays(pp)))
    return logits, val.labels, evaluate(model, val, pp, torch.device("cpu"))


def test_torchrun_two_processes_checkpoint_and_reported_top1(ddp_run: tuple[Path, str]) -> None:
    ckpt, stdout = ddp_run
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["ckpt.pth"]  # rank 0 alone wrote, no .partial left
    assert sorted(p.name for p in ckpt.parent.parent.iterdir()) == ["out"]
    ck = load_checkpoint(ckpt)
    assert ck.manifest.training["processes"] == 2 and ck.manifest.preprocess["input_size"] == [16, 16]
    assert ck.train_state is not None and "optimizer" in ck.train_state
    logits, labels, single = _val_logits(ckpt)
    top1 = float((logits.argmax(-1).numpy() == labels).mean())
    assert top1 == single  # the weights answer the same, evaluated in one process
    assert ck.manifest.training["best_val_accuracy"] == pytest.approx(single, abs=1e-12)  # all-reduced during training
    m = re.search(r"best validation top-1 ([0-9.]+)% \(epoch (\d+)/2\).*2 processes", stdout)
    assert m, stdout
    assert m.group(1) == f"{single * 100:.2f}"
    assert stdout.count("best validation top-1") == 1  # printed by rank 0 only


def test_resume_two_process_checkpoint_in_one_process(ddp_run: tuple[Path, str], tmp_path: Path) -> None:
    ckpt, _ = ddp_run
    src = load_checkpoint(ckpt)
    start = int(src.train_state["epoch"]) + 1  # type: ignore[index]
    out = tmp_path / "resumed.pth"
    r = train(None, TrainOptions(resume=ckpt, epochs=4, batch_size=32, out=out))
    assert r.world_size == 1 and [h["epoch"] for h in r.history] == list(range(start, 4))
    assert out.exists() and not partial_path(out).exists()
    ck = load_checkpoint(out)
    assert ck.manifest.labels == src.manifest.labels and ck.manifest.model == src.manifest.model
    assert r.best_val_accuracy >= src.manifest.training["best_val_accuracy"]
    # the optimizer state went on: AdamW's step count grew past the 2-process run's
    steps = lambda c: max(float(s["step"]) for s in c.train_state["optimizer"]["state"].values())  # noqa: E731
    if ck.train_state["epoch"] > src.train_state["epoch"]:  # type: ignore[index]
        assert steps(ck) > steps(src)


# --- one DDP step == one single-process step ---------------------------------------------------------------

_CFG = dict(image_size=(16, 16), patch_size=4, num_classes=10)


def _tiny_model() -> VisionTransformer:
    torch.manual_seed(0)
    cfg = ViTConfig.from_dict({**get_preset("vit-digits").config.to_dict(), **_CFG})
    return VisionTransformer(cfg)


def _global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)


def _odd_val() -> tuple[Split, Preprocess]:
    pp = Preprocess.from_dict({**get_preset("vit-digits").preprocess, "input_size": [16, 16]})
    val = load_digits_dataset(pp).val
    return Split(val.images[:101], val.labels[:101]), pp


def _ddp_worker(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as td
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    td.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        x, y = _global_batch()
        per = len(y) // world
        xs, ys = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
        results = {}
        for accum in (1, 2):
            model = _tiny_model()
            opt = torch.optim.SGD(model.parameters(), lr=0.5)  # AdamW's first step is sign(g): it would magnify float noise
            net = DDP(model)
            m = per // accum
            micro = [(xs[i * m : (i + 1) * m], ys[i * m : (i + 1) * m]) for i in range(accum)]
            train_step(net, opt, micro, label_smoothing=0.1)
            results[f"accum{accum}"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        val, pp = _odd_val()
        acc = evaluate(results_model(results["accum1"]), val, pp, torch.device("cpu"), batch=16, dist=Dist(rank, world))
        if rank == 0:
            torch.save({"weights": results, "acc": acc}, out)
    finally:
        td.destroy_process_group()


def results_model(state: dict[str, torch.Tensor]) -> VisionTransformer:
    m = _tiny_model()
    m.load_state_dict(state)
    return m


def test_one_ddp_step_equals_one_single_process_step(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    out = tmp_path / "ddp.pt"
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    got = torch.load(out, weights_only=True)
    model = _tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    train_step(model, opt, [_global_batch()], label_smoothing=0.1)
    single = model.state_dict()
    assert any(not torch.equal(single[k], before[k]) for k in single)  # the step moved the weights
    for accum in ("accum1", "accum2"):  # 2 processes x 8 images, and 2 processes x 2 micro-batches of 4
        for k, v in single.items():
            torch.testing.assert_close(got["weights"][accum][k], v, rtol=1e-5, atol=1e-6, msg=f"{accum} {k}")
    # validation split over 2 ranks (101 images: uneven shares) and summed == one process
    val, pp = _odd_val()
    assert got["acc"] == evaluate(results_model(got["weights"]["accum1"]), val, pp, torch.device("cpu"))


def test_accumulation_in_one_process_equals_the_whole_batch() -> None:
    x, y = _global_batch()
    a, b = _tiny_model(), _tiny_model()
    train_step(a, torch.optim.SGD(a.parameters(), lr=0.5), [(x, y)])
    train_step(b, torch.optim.SGD(b.parameters(), lr=0.5), [(x[:4], y[:4]), (x[4:10], y[4:10]), (x[10:], y[10:])])
    for k, v in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[k], v, rtol=1e-5, atol=1e-6)


# --- rendezvous -----------------------------------------------------------------------------------------------


def test_rendezvous_failure_is_one_line_naming_the_address(tmp_path: Path) -> None:
    port = _free_port()  # nobody listens there
    env = {**_env(), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "VITDEPLOY_RENDEZVOUS_TIMEOUT": "1"}
    r = subprocess.run([sys.executable, "-m", "vitdeploy", "train", "-o", "ck.pth"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    # torch's own c10d log may come first (as torchrun's would); then our one line, the last
    ours = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(ours) == 1 and r.stderr.strip().splitlines()[-1] == ours[0], r.stderr[-2000:]
    assert f"127.0.0.1:{port}" in ours[0] and "rendezvous" in ours[0] and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


# --- bad input: one line, exit 2, nothing written -------------------------------------------------------------

BAD = [
    (["--precision", "fp16", "--device", "cpu"], "needs a CUDA GPU"),
    (["--precision", "bf16", "--device", "cpu"], "needs a CUDA GPU"),
    (["--precision", "fp8"], "--precision must be one of"),
    (["--workers", "-1"], "--workers"),
    (["--accum-steps", "0"], "--accum-steps"),
    (["--accum-steps", "3"], "multiple of"),
    (["--epochs", "0"], "--epochs"),
    (["--epochs", "-1"], "--epochs"),
    (["--val-fraction", "1.0"], "--val-fraction"),
    (["--val-fraction", "0"], "--val-fraction"),
    (["--batch-size", "-8"], "--batch-size"),
    (["--batch-size", "0"], "--batch-size"),
    (["--image-size", "0"], "--image-size"),
    (["--patch-size", "0"], "--patch-size"),
    (["--lr", "-1"], "--lr"),
    (["--label-smoothing", "2"], "--label-smoothing"),
    (["--preset", "vit-nope"], "unknown preset 'vit-nope'"),
    (["-o", "t.onnx"], ".pth"),
    (["-o", "."], "is a folder"),
]


@pytest.mark.parametrize("args,match", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_nothing_written(
    args: list[str], match: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vitdeploy.__main__ import main

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)
    code = main(["train", *args])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and match in lines[0], err
    assert list(tmp_path.iterdir()) == []


# --- issue 15 item 10: -o is replaced only when the run ends ------------------------------------------------------


def test_ctrl_c_keeps_the_old_checkpoint_and_names_the_partial_best(tmp_path: Path) -> None:
    out = tmp_path / "ckpt.pth"
    out.write_bytes(b"the user's good checkpoint")
    seen: list[bytes] = []

    def on_event(kind: str, d: dict) -> None:
        if kind == "epoch":
            seen.append(out.read_bytes())
            assert partial_path(out).exists()
            if d["epoch"] == 1:
                raise KeyboardInterrupt

    with pytest.raises(VitdeployError, match=r"interrupted: .*ckpt.pth is unchanged.*ckpt.pth.partial") as e:
        train(None, TrainOptions(image_size=16, patch_size=4, epochs=5, batch_size=64, out=out), on_event)
    assert e.value.exit_code == 130
    assert seen == [b"the user's good checkpoint"] * 2  # never overwritten after an epoch
    assert out.read_bytes() == b"the user's good checkpoint"
    assert load_checkpoint(partial_path(out)).manifest.training["epochs"] == 5  # the partial best is a checkpoint
    # and a finished run renames it into place
    r = train(None, TrainOptions(image_size=16, patch_size=4, epochs=1, batch_size=64, out=out))
    assert load_checkpoint(out).manifest.training["best_val_accuracy"] == r.best_val_accuracy
    assert not partial_path(out).exists()


# --- CUDA ----------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_gpu
def test_torchrun_cuda_nccl_bf16(tmp_path: Path) -> None:
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    n = min(2, torch.cuda.device_count())
    r = _torchrun([*TINY, "--device", "cuda", "--precision", "bf16", "-o", "ck.pth"], tmp_path, nproc=n)
    assert r.returncode == 0, r.stderr[-3000:]
    ck = load_checkpoint(tmp_path / "ck.pth")
    assert ck.manifest.training["precision"] == "bf16" and ck.manifest.training["processes"] == n
    pp = Preprocess.from_dict(ck.manifest.preprocess)
    val = load_digits_dataset(pp).val
    acc = evaluate(ck.build().cuda(), val, pp, torch.device("cuda"), amp_dtype=torch.bfloat16)
    assert ck.manifest.training["best_val_accuracy"] == pytest.approx(acc, abs=1e-12)


@pytest.mark.gpu
@needs_gpu
def test_cuda_fp16_with_grad_scaler_and_default_precision(tmp_path: Path) -> None:
    r = train(None, TrainOptions(image_size=16, patch_size=4, epochs=1, batch_size=64, device="cuda", precision="fp16",
                                 out=tmp_path / "a.pth"))
    assert r.precision == "fp16" and 0 <= r.best_val_accuracy <= 1
    r = train(None, TrainOptions(image_size=16, patch_size=4, epochs=1, batch_size=64, device="cuda", out=tmp_path / "b.pth"))
    assert r.precision == ("bf16" if torch.cuda.is_bf16_supported() else "fp16")


def test_gpu_tests_skip_with_a_reason_here() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the gpu tests run")
    assert "CUDA" in needs_gpu.kwargs["reason"]
    assert shutil.which("torchrun", path=str(BIN))


# --- decoding in DataLoader workers ---------------------------------------------------------------------------


# Runs that start DataLoader workers, in one process of their own, as a user's run has them: workers started inside
# the test process, after other tests had loaded OpenVINO there, left it to die of SIGSEGV at the next child's exit
# (the whole suite with it). One process for both checks: each would otherwise pay torch's start-up again.
_IN_A_PROCESS = """
import sys, traceback
from pathlib import Path
import numpy as np
from vitdeploy.core.preprocess import Preprocess
from vitdeploy.model.data import load_image_folder
from vitdeploy.model.train import TrainOptions, _load_folder, train
from vitdeploy.model.vit import get_preset
root, work = Path(sys.argv[1]), Path(sys.argv[2])


def options_through_a_short_run():
    r = train(None, TrainOptions(image_size=16, patch_size=4, epochs=1, batch_size=32, accum_steps=2, workers=1,
                                 precision="fp32", out=work / "ck.pth"))
    assert r.precision == "fp32"


def workers_decode():
    pp = Preprocess.from_dict({**get_preset("vit-digits").preprocess, "input_size": [16, 16]})
    a, b = load_image_folder(root, pp, 0.2, 0), _load_folder(root, pp, 0.2, 0, workers=2)
    for sa, sb in ((a.train, b.train), (a.val, b.val)):
        assert sa.paths == sb.paths and np.array_equal(sa.labels, sb.labels)
        assert all(np.array_equal(x, y) for x, y in zip(sa.images, sb.images, strict=True))
    assert [Path(p).name for p, _ in b.skipped] == ["broken.png"] == [Path(p).name for p, _ in a.skipped]
    r = train(root, TrainOptions(image_size=16, patch_size=4, epochs=1, batch_size=8, workers=2, out=work / "o.pth"))
    assert [Path(p).name for p, _ in r.skipped] == ["broken.png"]


for check in (options_through_a_short_run, workers_decode):
    try:
        check()
        print(check.__name__, "passed", flush=True)
    except Exception:
        print(check.__name__, "failed:", traceback.format_exc(), flush=True)
"""


@pytest.fixture(scope="module")
def worker_runs(mixed_mode_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(the work folder, the output) of ``_IN_A_PROCESS`` on a copy of the mixed-mode folder with a broken PNG."""
    work = tmp_path_factory.mktemp("workers")
    root = work / "d"
    shutil.copytree(mixed_mode_folder, root)
    (root / "class_1" / "broken.png").write_bytes(b"\x89PNG not really")
    r = subprocess.run([sys.executable, "-c", _IN_A_PROCESS, str(root), str(work)], env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return work, r.stdout


def test_options_through_a_short_run(worker_runs: tuple[Path, str]) -> None:
    work, out = worker_runs
    assert "options_through_a_short_run passed" in out, out[-3000:]
    assert load_checkpoint(work / "ck.pth").manifest.training["accum_steps"] == 2


def test_workers_decode_the_folder_and_name_an_unreadable_file_once(worker_runs: tuple[Path, str]) -> None:
    work, out = worker_runs
    assert "workers_decode passed" in out, out[-3000:]
    assert (work / "o.pth").exists()


def test_cli_reports_a_worker_skipped_file_once_and_exits_3(mixed_mode_folder: Path, tmp_path: Path) -> None:
    root = tmp_path / "d"
    shutil.copytree(mixed_mode_folder, root)
    (root / "class_0" / "empty.png").write_bytes(b"")
    r = subprocess.run([sys.executable, "-m", "vitdeploy", "train", str(root), *TINY[:4], "--epochs", "1",
                        "--batch-size", "8", "--workers", "2", "-o", "o.pth"], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=300)
    code, err = r.returncode, r.stderr
    assert code == 3, err
    assert err.count("empty.png") == 1 and (tmp_path / "o.pth").exists()
