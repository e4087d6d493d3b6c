"""Measure `vitdeploy infer SOURCE -o DIR/` on one machine, in one run (issue 41, item 6, the corpus half).

Prints, with the command line of every run:
- images/s in-process and on Ray (--ray) on N 32-px PNGs of which B cannot be read, and today's `-o FILE.npy` path;
- that the three give the same rows and L2-normalised vectors within 1e-6, each readable image once, every
  unreadable file in errors.parquet;
- resume: the driver SIGKILLed once half the shards exist, then the same command again: each image once, the
  finished shards keep bytes and mtime, and the rerun's time as a share of a full run (in-process and on Ray);
- the driver's peak RSS (VmHWM of the driver process alone, sampled until it exits) at 10k and at 100k images, both
  executors (the 100k folder: hard links to the N PNGs, each path its own);
- whether any Ray process of a run (its raylet or GCS, found by the run's session folder) outlives the command.

    python scripts/bench_corpus.py --model embed.onnx --work /tmp/corpus-bench [--images 20000 --bad 200]
        [--rss 10000,100000] [--json bench.json] [--no-ray]

`--model`: `make demo`'s embedding model (demo/embed.onnx), run with --backend onnxruntime. Figures are what this
machine gave on this run; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def write_corpus(folder: Path, n: int, bad: int, seed: int = 0) -> None:
    """``n`` distinct 32x32 RGB PNGs (scikit-learn's digits, upscaled, each with its own noise) in 10 class folders,
    ``bad`` of them replaced by files that are no image (spread through the corpus)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    if folder.is_dir() and sum(1 for _ in folder.rglob("*.png")) == n:
        return
    shutil.rmtree(folder, ignore_errors=True)
    d = load_digits()
    rng = np.random.default_rng(seed)
    bad_at = set(rng.choice(n, size=bad, replace=False).tolist()) if bad else set()
    for i in range(n):
        k = i % len(d.images)
        sub = folder / str(int(d.target[k]))
        sub.mkdir(parents=True, exist_ok=True)
        path = sub / f"{i:07d}.png"
        if i in bad_at:
            path.write_bytes(b"this is not a PNG " + str(i).encode())
            continue
        g = (d.images[k] * 16).clip(0, 255).astype(np.uint8)
        img = np.asarray(Image.fromarray(g).resize((32, 32), Image.Resampling.BILINEAR), np.int16)
        img = (img[..., None] + rng.integers(-8, 9, (32, 32, 3))).clip(0, 255).astype(np.uint8)
        Image.fromarray(img).save(path)


def link_corpus(src: Path, folder: Path, n: int) -> None:
    """``n`` paths (hard links, 100 folders) to the readable PNGs of ``src``, in turn."""
    if folder.is_dir() and sum(1 for _ in folder.rglob("*.png")) == n:
        return
    shutil.rmtree(folder, ignore_errors=True)
    files = [f for f in sorted(src.rglob("*.png")) if f.read_bytes()[:4] == b"\x89PNG"]
    for i in range(n):
        sub = folder / f"{i % 100:03d}"
        sub.mkdir(parents=True, exist_ok=True)
        os.link(files[i % len(files)], sub / f"{i:07d}.png")


def run(cmd: list[str], kill_when: Path | None = None, kill_at: int = 0) -> dict:
    """Run a vitdeploy command; its seconds, exit code, the driver's peak RSS (MiB) and, with ``kill_when``, SIGKILL
    once ``kill_at`` shards exist there."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hwm = 0
    killed = False
    while not os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
        try:
            m = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{p.pid}/status").read_text())
            hwm = max(hwm, int(m.group(1)) if m else 0)
        except (OSError, ValueError):
            pass
        if kill_when is not None and len(list(kill_when.glob("part-*.parquet"))) >= kill_at:
            p.send_signal(signal.SIGKILL)
            killed = True
            break
        time.sleep(0.05)
    _, status, usage = os.wait4(p.pid, 0)  # the driver's own CPU time (and that of the children it reaped)
    p.returncode = os.waitstatus_to_exitcode(status)
    out, err = p.communicate()
    return {"cmd": " ".join(cmd), "seconds": time.perf_counter() - t0, "rc": p.returncode, "rss_mib": hwm / 1024,
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "killed": killed, "stderr_tail": err.strip().splitlines()[-1:] if err.strip() else [],
            "session_pid": p.pid}


def ray_left(pid: int) -> list[str]:
    """Ray's daemons (raylet, gcs_server, agents) of the local Ray a driver ``pid`` started, still running."""
    left = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if re.search(rf"session_\S+_{pid}\b", cmd):
            left.append(f"{d.name}: {cmd[:80]}")
    return left


def shards(folder: Path) -> tuple[list[str], np.ndarray, list[int], int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(f) for f in sorted(folder.glob("part-*.parquet"))]
    t = pa.concat_tables(tables)
    vec = t.column("embedding").combine_chunks().flatten().to_numpy().reshape(t.num_rows, -1)
    errors = pq.read_table(folder / "errors.parquet").num_rows
    return t.column("path").to_pylist(), vec, t.column("id").to_pylist(), errors


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def stat_of(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    return {f.name: (f.stat().st_size, f.stat().st_mtime_ns, f.read_bytes()) for f in folder.glob("part-*.parquet")}


def save(report: dict, path: Path | None) -> None:
    """The figures so far (each section saves: a long run's early figures survive an interrupted one)."""
    if path is not None:
        path.write_text(json.dumps(report, indent=1, default=str))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--images", type=int, default=20_000)
    ap.add_argument("--bad", type=int, default=200)
    ap.add_argument("--shard-size", type=int, default=500)
    ap.add_argument("--rss", default="10000,100000")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--sections", default="speed,resume,rss", help="which to run: speed, resume, rss")
    a = ap.parse_args()
    work = a.work
    work.mkdir(parents=True, exist_ok=True)
    vd = [sys.executable, "-m", "vitdeploy", "infer"]
    model = ["-m", str(a.model), "--backend", "onnxruntime"]
    corpus = work / f"png{a.images}"
    t0 = time.perf_counter()
    write_corpus(corpus, a.images, a.bad)
    print(f"corpus: {a.images} 32-px PNGs, {a.bad} unreadable, in {corpus} ({time.perf_counter() - t0:.0f} s to write)")
    report: dict = {"images": a.images, "bad": a.bad, "shard_size": a.shard_size, "cores": len(os.sched_getaffinity(0))}
    executors = [("in-process", [])] + ([] if a.no_ray else [("ray", ["--ray"])])

    sections = set(a.sections.split(","))
    if a.json and a.json.is_file():  # figures of an earlier run's other sections stay
        report = {**json.loads(a.json.read_text()), **report}
    for f in ([] if "speed" not in sections else [work / "today.npy", work / "today.files.txt"]):
        f.unlink(missing_ok=True)
    speed(a, work, vd, model, corpus, executors, report) if "speed" in sections else None
    if "resume" in sections:
        resume(a, work, vd, model, corpus, executors, report)
    if "rss" in sections:
        rss(a, work, vd, model, corpus, executors, report)
    save(report, a.json)
    return 0


def speed(a: argparse.Namespace, work: Path, vd: list[str], model: list[str], corpus: Path, executors: list,
          report: dict) -> None:
    r = run([*vd, str(corpus), *model, "-o", str(work / "today.npy")])
    report["npy"] = r
    print(f"today's path   {r['seconds']:7.1f} s  {(a.images - a.bad) / r['seconds']:7.1f} images/s  rc {r['rc']}  "
          f"RSS {r['rss_mib']:.0f} MiB   $ {r['cmd']}")
    want_paths = (work / "today.files.txt").read_text().splitlines()
    want = np.load(work / "today.npy")
    for name, extra in executors:
        out = work / f"shards-{name}"
        shutil.rmtree(out, ignore_errors=True)
        r = run([*vd, str(corpus), *model, "-o", f"{out}/", "--shard-size", str(a.shard_size), *extra])
        paths, vec, ids, errors = shards(out)
        r["images_per_second"] = (a.images - a.bad) / r["seconds"]
        r["same_rows"] = paths == want_paths
        r["max_abs_diff_unit"] = float(np.abs(unit(vec) - unit(want)).max()) if len(vec) == len(want) else None
        r["each_once"] = len(ids) == len(set(ids)) == a.images - a.bad
        r["errors_listed"] = errors
        if extra:
            r["ray_left"] = ray_left(r["session_pid"])
        report[name] = r
        print(f"{name:14} {r['seconds']:7.1f} s  {r['images_per_second']:7.1f} images/s  rc {r['rc']}  RSS "
              f"{r['rss_mib']:.0f} MiB  same rows as .npy: {r['same_rows']}  max |Δ| {r['max_abs_diff_unit']}  "
              f"each once: {r['each_once']}  errors.parquet: {errors}"
              + (f"  Ray processes left: {len(r['ray_left'])}" if extra else "") + f"   $ {r['cmd']}")
    save(report, a.json)
    if "ray" in report:
        ratio = report["ray"]["seconds"] / report["in-process"]["seconds"]
        print(f"--ray / in-process time: {ratio:.2f}x (target: at most 1.2x + 30 s: "
              f"{report['ray']['seconds']:.1f} s vs {1.2 * report['in-process']['seconds'] + 30:.1f} s)")



def resume(a: argparse.Namespace, work: Path, vd: list[str], model: list[str], corpus: Path, executors: list,
           report: dict) -> None:
    """A full run, then a run SIGKILLed once half the shards exist and the same command again, back to back (the
    load of a shared machine changes by the minute: the ratio compares neighbours)."""
    n_shards = -(-a.images // a.shard_size)
    for name, extra in executors:
        out = work / f"resume-{name}"
        shutil.rmtree(out, ignore_errors=True)
        cmd = [*vd, str(corpus), *model, "-o", f"{out}/", "--shard-size", str(a.shard_size), *extra]
        full_run = run(cmd)
        shutil.rmtree(out, ignore_errors=True)
        k = run(cmd, kill_when=out, kill_at=n_shards // 2)
        time.sleep(2)  # a killed local Ray's daemons follow their driver (fate sharing)
        left_after_kill = ray_left(k["session_pid"]) if extra else []
        before = stat_of(out)
        r = run(cmd)
        after = stat_of(out)
        _, _, ids, errors = shards(out)
        full = full_run["seconds"]
        res = {"full": full_run, "kill": k, "rerun": r, "shards_at_kill": len(before),
               "rerun_cpu_over_full_cpu": r["cpu_seconds"] / max(1e-9, full_run["cpu_seconds"]),
               "kept_unchanged": all(after.get(f) == v for f, v in before.items()),
               "each_once": len(ids) == len(set(ids)) == a.images - a.bad, "errors_listed": errors,
               "rerun_over_full": r["seconds"] / full, "ray_left_after_kill": left_after_kill}
        report[f"resume-{name}"] = res
        print(f"resume {name:10} killed with {len(before)}/{n_shards} shards; rerun {r['seconds']:.1f} s = "
              f"{res['rerun_over_full']:.0%} of a full run ({full:.1f} s just before; driver CPU "
              f"{r['cpu_seconds']:.1f} s vs {full_run['cpu_seconds']:.1f} s = {res['rerun_cpu_over_full_cpu']:.0%}); finished shards kept bytes and mtime: "
              f"{res['kept_unchanged']}; each image once: {res['each_once']}; rc {r['rc']}"
              + (f"; Ray processes left after the kill: {len(left_after_kill)}" if extra else "")
              + f"   $ {r['cmd']}")
        save(report, a.json)


def rss(a: argparse.Namespace, work: Path, vd: list[str], model: list[str], corpus: Path, executors: list,
        report: dict) -> None:
    """The driver's peak RSS at 10k and 100k images."""
    sizes = [int(s) for s in a.rss.split(",") if s]
    for name, extra in executors:
        for n in sizes:
            folder = work / f"links{n}"
            link_corpus(corpus, folder, n)
            out = work / f"rss-{name}-{n}"
            shutil.rmtree(out, ignore_errors=True)
            r = run([*vd, str(folder), *model, "-o", f"{out}/", *extra])
            report[f"rss-{name}-{n}"] = r
            save(report, a.json)
            print(f"RSS {name:10} {n:7d} images: driver peak {r['rss_mib']:.0f} MiB in {r['seconds']:.1f} s "
                  f"({n / r['seconds']:.0f} images/s) rc {r['rc']}   $ {r['cmd']}")
        if len(sizes) == 2:
            d = report[f"rss-{name}-{sizes[1]}"]["rss_mib"] - report[f"rss-{name}-{sizes[0]}"]["rss_mib"]
            print(f"RSS {name}: {sizes[1]} images - {sizes[0]} images = {d:+.0f} MiB (target: within 60 MB)")


if __name__ == "__main__":
    raise SystemExit(main())
