"""The frozen-feature probe's Done-when figures (issue 36): `train digits --init <DINOv2-S> --probe linear`.

    PYTHONPATH=$PWD python scripts/bench_probe.py [--folder DIR] [--image-size 112] [--runs 2] [--no-exact]

1. The backbone: timm's ``vit_small_patch14_dinov2`` with random weights (seed 0) and ``num_classes=0``, its state dict
   imported with ``vitdeploy import --arch vit_small_patch14_dinov2 --image-size N`` (DINOv2 runs at 518; a 2-core CPU
   computes 1,797 images at 112 in about a minute, at 224 in about four).
2. The digits ImageFolder: ``vitdeploy datasets digits DIR`` (1,437 train / 360 val).
3. The timed command, ``/usr/bin/time vitdeploy train DIR --init backbone.pth --probe linear -o probe.pth``, ``--runs``
   times with the features cache removed first (each run computes the features), then once more reading the cache.
   The CPU model, the cores and the load average (other jobs share the machine) are printed beside each time.
4. scikit-learn on the same cached features (the pooling the probe kept, the same train/val split): LogisticRegression
   at the C the probe chose, with ``newton-cholesky`` (exact; ``--no-exact`` skips it: minutes for a 7,680-parameter
   Hessian on 2 cores) and with its default ``lbfgs`` (max_iter 1000), each with its val top-1 and its objective
   (mean cross-entropy + ||W||² / 2CN, the one both minimise); and ``LogisticRegression()`` as it comes (C=1).
5. The folded classifier's ONNX (``vitdeploy export probe.pth``) on every val image under ONNX Runtime against the
   probe's head applied to the backbone's own ONNX features (``vitdeploy export backbone.pth --pool POOL``: the fold
   alone) and to the cached torch features: the largest |Δlogit|, absolute and relative to the largest |logit|.

Speed targets live here, not in a timed test (DESIGN.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

VITDEPLOY = [sys.executable, "-m", "vitdeploy"]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def load() -> str:
    a, b, c = os.getloadavg()
    return f"load average {a:.2f}, {b:.2f}, {c:.2f} on {os.cpu_count()} cores"


def make_inputs(folder: Path, size: int) -> tuple[Path, Path]:
    """The imported DINOv2-S backbone and the digits ImageFolder (made once per folder)."""
    backbone, digits = folder / f"dinov2s_{size}.pth", folder / "digits"
    if not backbone.is_file():
        import timm
        import torch

        torch.manual_seed(0)
        m = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=0)
        sd = folder / "dinov2s_timm.pth"
        torch.save(m.state_dict(), sd)
        subprocess.run([*VITDEPLOY, "import", str(sd), "--arch", "vit_small_patch14_dinov2", "--image-size", str(size),
                        "-o", str(backbone)], check=True, stdout=subprocess.DEVNULL)
    if not digits.is_dir():
        subprocess.run([*VITDEPLOY, "datasets", "digits", str(digits)], check=True, stdout=subprocess.DEVNULL)
    return backbone, digits


def timed_probe(digits: Path, backbone: Path, out: Path) -> float:
    """One `vitdeploy train --probe linear` under /usr/bin/time; its wall seconds (its output is printed)."""
    timer = ["/usr/bin/time", "-f", "  /usr/bin/time: wall %e s, user %U s, sys %S s, max RSS %M KB"] \
        if Path("/usr/bin/time").is_file() else []
    cmd = [*timer, *VITDEPLOY, "train", str(digits), "--init", str(backbone), "--probe", "linear", "-o", str(out)]
    print(f"$ vitdeploy train {digits} --init {backbone} --probe linear -o {out}    ({load()})")
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    print("\n".join("  " + ln for ln in (r.stdout + r.stderr).strip().splitlines()))
    if r.returncode != 0:
        raise SystemExit(f"the probe failed (exit {r.returncode})")
    print(f"  wall {wall:.1f} s    (after: {load()})")
    return wall


def objective(logits: np.ndarray, y: np.ndarray, w: np.ndarray, c: float) -> float:
    """Mean cross-entropy + ||W||² / (2·C·N): what LogisticRegression(C) and the probe minimise."""
    z = logits - logits.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean() + 0.5 / (c * len(y)) * (w**2).sum())


def sklearn_figures(ckpt: Path, exact: bool) -> None:
    """scikit-learn's LogisticRegression on the probe's cached features, beside the probe (see the module docstring)."""
    from sklearn.linear_model import LogisticRegression

    from vitdeploy.model.checkpoint import load_checkpoint
    from vitdeploy.model.probe import cache_path

    probe = load_checkpoint(ckpt).manifest.extra["task"]["probe"]
    z = np.load(cache_path(ckpt))
    x, y, is_val = z["features"].astype(np.float64), z["labels"], z["is_val"]
    d = x.shape[1] // 2
    x = {"cls": x[:, :d], "mean": x[:, d:]}.get(probe["features"], x)
    tr, va = np.flatnonzero(~is_val), np.flatnonzero(is_val)
    c = float(probe["C"])
    head = load_checkpoint(ckpt).state_dict
    w, b = head["head.weight"].double().numpy(), head["head.bias"].double().numpy()
    ours_obj = objective(x[tr] @ w.T + b, y[tr], w, c)
    print(f"probe: {probe['features']} features ({x.shape[1]}-d), C={c:.4g}: val top-1 {probe['val_top1']:.2%}, "
          f"objective {ours_obj:.6f}")
    runs = [("newton-cholesky", dict(solver="newton-cholesky", C=c, max_iter=1000, tol=1e-8))] if exact else []
    runs += [("lbfgs, max_iter 1000", dict(C=c, max_iter=1000)), ("LogisticRegression() (C=1, lbfgs, max_iter 100)", {})]
    for name, kw in runs:
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sk = LogisticRegression(**kw).fit(x[tr], y[tr])
        acc = float(sk.score(x[va], y[va]))
        obj = objective(sk.decision_function(x[tr]), y[tr], sk.coef_, float(kw.get("C", 1.0)))
        conv = "converged" if not any("converge" in str(m.message) for m in caught) else "NOT converged"
        print(f"sklearn {name}: val top-1 {acc:.2%} (probe − sklearn {100 * (probe['val_top1'] - acc):+.2f} points), "
              f"objective {obj:.6f}, {conv}, {time.perf_counter() - t0:.0f} s")


def onnx_figures(ckpt: Path, backbone: Path, folder: Path) -> None:
    """`vitdeploy export` the folded classifier, and the backbone as an embedding model with the probe's pooling
    (`export --pool`); on ONNX Runtime, over every val image, the folded logits against the head applied to the
    backbone's ONNX features (what the fold is) and to the cached torch features."""
    import onnxruntime as ort

    from vitdeploy.core.preprocess import preprocess_file
    from vitdeploy.model.checkpoint import load_checkpoint
    from vitdeploy.model.probe import cache_path

    ck = load_checkpoint(ckpt)
    pool = ck.manifest.extra["task"]["probe"]["features"]
    folded, features = folder / "probe.onnx", folder / "backbone.onnx"
    subprocess.run([*VITDEPLOY, "export", str(ckpt), "-o", str(folded)], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*VITDEPLOY, "export", str(backbone), "--pool", pool, "-o", str(features)], check=True,
                   stdout=subprocess.DEVNULL)
    z = np.load(cache_path(ckpt))
    va = np.flatnonzero(z["is_val"])
    x = z["features"].astype(np.float64)
    d = x.shape[1] // 2
    x = {"cls": x[:, :d], "mean": x[:, d:]}.get(pool, x)
    w, b = ck.state_dict["head.weight"].double().numpy(), ck.state_dict["head.bias"].double().numpy()
    pp = ck.manifest.pp()
    paths = [str(p) for p in z["paths"][va]]

    def run(path: Path) -> np.ndarray:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return np.concatenate([sess.run(None, {name: np.stack([preprocess_file(p, pp) for p in paths[i:i + 64]])})[0]
                               for i in range(0, len(paths), 64)]).astype(np.float64)

    got = run(folded)
    on_onnx, on_cache = run(features) @ w.T + b, x[va] @ w.T + b
    big = float(np.abs(on_cache).max())
    for what, want in (("head(the backbone's ONNX features)", on_onnx), ("head(cached torch features)", on_cache)):
        diff = float(np.abs(got - want).max())
        print(f"folded ONNX vs {what} on {len(va)} val images: max |Δlogit| {diff:.2e} (largest |logit| {big:.3g}, "
              f"relative {diff / big:.2e}); top-1 agreement {(got.argmax(1) == want.argmax(1)).mean():.2%}")
    rel = np.abs(z["features"][va].astype(np.float64) - run(features).astype(np.float64)).max()
    print(f"  the features themselves, ONNX Runtime vs torch: max |Δ| {rel:.2e} (largest |feature| "
          f"{np.abs(x).max():.3g}); the head's largest |weight| {np.abs(w).max():.3g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=Path, default=Path("/tmp/vitdeploy-bench-probe"))
    ap.add_argument("--image-size", type=int, default=112)
    ap.add_argument("--runs", type=int, default=2, help="timed runs that compute the features")
    ap.add_argument("--no-exact", action="store_true", help="skip scikit-learn's newton-cholesky (minutes)")
    ap.add_argument("--only-figures", action="store_true", help="no timed runs: the figures of an earlier run's folder")
    a = ap.parse_args()
    a.folder.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {load()}")
    backbone, digits = make_inputs(a.folder, a.image_size)
    out = a.folder / "probe.pth"
    walls = []
    for _ in range(0 if a.only_figures else a.runs):
        Path(str(out) + ".features.npz").unlink(missing_ok=True)
        walls.append(timed_probe(digits, backbone, out))
    if not a.only_figures:
        cached = timed_probe(digits, backbone, out)
        print(f"wall, features computed: {', '.join(f'{w:.1f} s' for w in walls)}; features read from the cache: "
              f"{cached:.1f} s (target: <= 180 s on 2 cores)")
    sklearn_figures(out, exact=not a.no_exact)
    onnx_figures(out, backbone, a.folder)


if __name__ == "__main__":
    main()
