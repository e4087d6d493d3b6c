"""Per index type, at 1M vectors: build time, bytes, 10-recall@10 against exact search and the median single-query
latency (issue 41, item 6: measured, not claimed). The vectors are issue 41's Gaussian mixture: 2,000 unit centres
in 128 dimensions, noise 0.08 per dimension, L2-normalised. Each index is built as `vitdeploy index` builds it
(tools/index.build_one: the same keys, training, tuning of nprobe / efSearch to --recall on 1,000 held-out
vectors), and its recall is measured again here on 1,000 fresh queries with an exact search by faiss.knn.

    python scripts/bench_index.py                      # 1M x 128, every kind that the machine's memory allows
    python scripts/bench_index.py --n 100000 --kinds flat,ivf-sq --json bench-index.json

HNSW's graph build is the slow one (minutes per million vectors on two cores); --kinds leaves it out where wanted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def mixture(n: int, d: int, centres: int, noise: float, seed: int) -> np.ndarray:
    c = np.random.default_rng(0).standard_normal((centres, d)).astype(np.float32)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    rng = np.random.default_rng(seed + 1000)
    x = c[rng.integers(0, centres, n)] + noise * rng.standard_normal((n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--centres", type=int, default=2000)
    ap.add_argument("--noise", type=float, default=0.08)
    ap.add_argument("--recall", type=float, default=0.95)
    ap.add_argument("--kinds", default="flat,hnsw,ivf-sq,ivf-pq", help="comma-separated: flat, hnsw, ivf-sq, ivf-pq")
    ap.add_argument("--pq", type=int, default=32, help="bytes per vector of the IVF-PQ index")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    args = ap.parse_args(argv)

    import faiss

    from vitdeploy.core.host import available_cores
    from vitdeploy.tools.index import RECALL_K, Candidate, build_one, candidates, median_latency_ms, recall_at

    threads = args.threads or available_cores()
    faiss.omp_set_num_threads(threads)
    x = mixture(args.n, args.dim, args.centres, args.noise, seed=0)
    held = mixture(1000, args.dim, args.centres, args.noise, seed=1)  # tuning queries, not in the index
    fresh = mixture(1000, args.dim, args.centres, args.noise, seed=2)  # measuring queries, not in the index either
    ids = np.arange(args.n, dtype=np.int64)
    t0 = time.perf_counter()
    exact_held = faiss.knn(held, x, RECALL_K, metric=faiss.METRIC_INNER_PRODUCT)[1]
    exact_fresh = faiss.knn(fresh, x, RECALL_K, metric=faiss.METRIC_INNER_PRODUCT)[1]
    exact_s = (time.perf_counter() - t0) / 2
    wanted = set(args.kinds.split(","))
    cands: list[Candidate] = []
    for c in candidates(args.n, args.dim, flat_max_macs=1 << 62):
        if c.kind not in wanted or any(k.kind == c.kind for k in cands):
            continue
        if c.kind == "ivf-pq" and not c.key.endswith(f"PQ{args.pq}"):
            continue
        cands.append(c)
    rows = []
    print(f"{args.n} x {args.dim}-d vectors ({args.centres} centres, noise {args.noise}), {threads} thread(s); exact "
          f"search of 1,000 queries took {exact_s:.2f} s", flush=True)
    for c in cands:
        built = build_one(c, x, ids, held, exact_held, args.recall, seed=0,
                          say=lambda s: print(f"  {s}", file=sys.stderr, flush=True))
        _, got = built.index.search(fresh, RECALL_K)
        row = {"key": c.key, "kind": c.kind, "build_seconds": round(built.seconds, 2),
               "bytes": len(faiss.serialize_index(built.index)), "param": built.param,
               "recall_at_10_tuning": round(built.recall, 4), "recall_at_10": round(recall_at(got, exact_fresh), 4),
               "latency_ms_median": round(median_latency_ms(built.index, fresh), 4), "threads": threads}
        rows.append(row)
        print(f"{row['key']:>16}  build {row['build_seconds']:8.1f} s  {row['bytes'] / 2**20:8.1f} MiB  "
              f"10-recall@10 {row['recall_at_10']:.4f} (param {row['param']})  median query "
              f"{row['latency_ms_median']:.3f} ms", flush=True)
        del built
    if args.json:
        Path(args.json).write_text(json.dumps({"n": args.n, "dim": args.dim, "centres": args.centres,
                                               "noise": args.noise, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
