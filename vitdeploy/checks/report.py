"""The verify report as an HTML page with plots a person reads at a glance.

``write_report(report, out_dir)`` turns a ``VerifyReport`` into ``index.html``
plus PNGs beside it: accuracy and agreement per artifact (bars), a histogram of
|Δlogit| per candidate against the reference, a confusion matrix per artifact
(when the images are labeled), and thumbnails of the images on which a
candidate's top-1 differs from the reference's, with both labels.

matplotlib is used through ``Figure`` and the Agg canvas only (no pyplot), so
it needs no display and leaves no global backend state behind. Every file is
written atomically and the page last, so a failed run never leaves a page that
points at missing pictures.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitdeploy.checks.metrics import logit_limit, softmax
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.fileio import atomic_path, write_text_atomic
from vitdeploy.core.text import printable

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from vitdeploy.checks.verify import ArtifactResult, VerifyReport

MAX_DISAGREEMENTS = 60  # thumbnails per candidate; the page says how many more there are
THUMB = 96
ANNOTATE_MAX_CLASSES = 20
HIST_MAX_VALUES = 2_000_000  # |Δlogit| values histogrammed; max and mean always use them all
DPI = 100


def _figure(w: float, h: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=DPI, layout="constrained")


def _save(fig: Figure, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    return path


def _short(name: str, n: int = 28) -> str:
    name = Path(name).name or name
    return name if len(name) <= n else "…" + name[-(n - 1) :]


# --- plots ---------------------------------------------------------------------------------------------


def plot_accuracy(report: VerifyReport, path: Path) -> Path:
    """Bars per artifact: top-1 accuracy (labeled images) and top-1 agreement with the reference."""
    results = report.results
    names = [_short(r.artifact) for r in results]
    series: list[tuple[str, list[float], str]] = []
    if report.labels is not None:
        series.append(("top-1 accuracy", [r.top1 or 0.0 for r in results], "#4c72b0"))
    series.append(("agreement with the reference", [r.agreement for r in results], "#55a868"))
    fig = _figure(max(5.0, 1.4 * len(results) + 2), 3.6)
    ax = fig.add_subplot()
    x = np.arange(len(results))
    width = 0.8 / len(series)
    for k, (label, vals, color) in enumerate(series):
        bars = ax.bar(x + (k - (len(series) - 1) / 2) * width, [v * 100 for v in vals], width, label=label, color=color)
        ax.bar_label(bars, labels=[f"{v:.1%}" for v in vals], fontsize=8, padding=2)
    lo = min(min(v for _, vals, _ in series for v in vals) * 100, 90.0)
    ax.set_ylim(max(0.0, math.floor(lo / 10) * 10 - 5), 116)
    ax.set_yticks([t for t in ax.get_yticks() if t <= 100])
    ax.set_xticks(x, names, fontsize=8, rotation=0 if len(results) <= 4 else 20)
    ax.set_ylabel("%")
    ax.set_title(f"{len(report.paths)} images from {_short(report.images, 40)}", fontsize=10)
    ax.legend(loc="upper center", ncol=len(series), fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_delta_histogram(candidate: ArtifactResult, reference: ArtifactResult, path: Path) -> Path:
    """|Δlogit| over every image and class, on a log axis (the spread spans decades: 1e-7 for fp32, 1e-1 for int8)."""
    d = np.abs(candidate.logits.astype(np.float32) - reference.logits.astype(np.float32)).ravel()
    zeros = int((d == 0).sum())
    pos = d[d > 0]
    d_max, d_mean = (float(pos.max()) if len(pos) else 0.0), float(d.mean()) if d.size else 0.0
    sampled = len(pos) > HIST_MAX_VALUES  # ImageNet-sized runs: 50,000 × 1000 logits
    if sampled:
        pos = pos[:: math.ceil(len(pos) / HIST_MAX_VALUES)]
    fig = _figure(5.4, 3.2)
    ax = fig.add_subplot()
    if len(pos):
        lo, hi = math.floor(math.log10(pos.min())), math.ceil(math.log10(d_max))
        hi = max(hi, lo + 1)
        ax.hist(pos, bins=np.logspace(lo, hi, 10 * (hi - lo) + 1).tolist(), color="#dd8452")
        ax.set_xscale("log")
        ax.axvline(d_max, color="#c44e52", lw=1, ls="--", label=f"max {d_max:.2e}")
        ax.axvline(d_mean, color="#4c72b0", lw=1, ls=":", label=f"mean {d_mean:.2e}")
        tol = candidate.tolerance
        if tol is not None and tol.rtol is not None:  # verify's bound for this candidate
            limit = logit_limit(tol.rtol, reference.max_abs_logit)
            ax.axvline(limit, color="#2e7d32", lw=1.5, label=f"limit {limit:.2e}")
            lo_x, hi_x = ax.get_xlim()
            ax.set_xlim(min(lo_x, limit / 3), max(hi_x, limit * 3))
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "identical logits", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("|Δlogit| against the reference")
    ax.set_ylabel("logits (images × classes)")
    extra = (f" · {zeros} exactly 0" if zeros else "") + (" · histogram of a sample" if sampled else "")
    ax.set_title(f"{_short(candidate.artifact)} ({candidate.precision}){extra}", fontsize=10)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """[true, predicted] counts."""
    m = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(m, (labels, predictions), 1)
    return m


def plot_confusion(result: ArtifactResult, labels: np.ndarray, class_labels: list[str], path: Path) -> Path:
    """Rows: true class; columns: predicted; shaded by the share of each row, counts written when classes are few."""
    c = max(len(class_labels), int(result.logits.shape[1]))
    m = confusion_matrix(labels, result.predictions, c)
    share = m / np.maximum(m.sum(axis=1, keepdims=True), 1)
    size = min(9.0, max(4.2, 0.42 * c + 1.6))
    fig = _figure(size, size * 0.9)
    ax = fig.add_subplot()
    im = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, shrink=0.8, label="share of the true class")
    if c <= ANNOTATE_MAX_CLASSES:
        names = [_short(n, 12) for n in class_labels] + [str(i) for i in range(len(class_labels), c)]
        ax.set_xticks(range(c), names, fontsize=7, rotation=45 if max(map(len, names)) > 3 else 0)
        ax.set_yticks(range(c), names, fontsize=7)
        for i in range(c):
            for j in range(c):
                if m[i, j]:
                    ax.text(j, i, str(m[i, j]), ha="center", va="center", fontsize=7,
                            color="white" if share[i, j] > 0.5 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    acc = f"top-1 {result.top1:.2%}" if result.top1 is not None else ""
    ax.set_title(f"{_short(result.artifact)} ({result.precision}) {acc}", fontsize=10)
    return _save(fig, path)


def write_thumbnail(src: str | Path, path: Path, size: int = THUMB) -> Path | None:
    """A small PNG of an image as it is on disk (None when it can no longer be read)."""
    from PIL import Image

    from vitdeploy.core.preprocess import ImageReadError, load_image

    try:
        img = load_image(src)
    except ImageReadError:
        return None
    scale = size / max(img.size)
    new = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
    small = img.width < size and img.height < size
    img = img.resize(new, Image.Resampling.NEAREST if small else Image.Resampling.LANCZOS)
    with atomic_path(path) as tmp:
        img.save(tmp, format="PNG")
    return path


# --- the page ------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "DejaVu Sans", sans-serif; margin: 24px auto; max-width: 1200px;
       color: #222; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.verdict { display: inline-block; padding: 2px 10px; border-radius: 4px; color: white; font-weight: bold; }
.pass { background: #2e7d32; } .fail { background: #c62828; }
table { border-collapse: collapse; font-size: 0.9em; } td, th { padding: 4px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; background: #f5f5f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.plots { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; } .plots img { max-width: 100%; }
.grid { display: flex; flex-wrap: wrap; gap: 10px; }
figure.thumb { margin: 0; width: 124px; font-size: 0.75em; text-align: center; border: 1px solid #eee;
               padding: 6px; border-radius: 4px; }
figure.thumb img { image-rendering: pixelated; width: 96px; height: 96px; object-fit: contain; background: #fafafa; }
.ref { color: #1f4e9c; } .cand { color: #b23c17; } .truth { color: #555; } .muted { color: #777; }
"""


def _e(x: Any) -> str:
    """Text for the page: controls, bidi overrides and line separators escaped (core.text), then HTML-escaped."""
    return html.escape(printable(x), quote=True)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.2%}"


def _table(report: VerifyReport) -> str:
    labeled = report.labels is not None
    head = ["artifact", "backend", "precision"] + (["top-1", "top-5"] if labeled else [])
    head += ["agreement", "max |Δlogit|", "mean |Δlogit|", "cosine", "result"]
    rows = ["<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for r in report.results:
        verdict = "reference" if r.is_reference else ("ok" if r.passed else "FAIL")
        cells = [f"<td>{_e(r.artifact)}</td>", f"<td>{_e(r.backend)}</td>", f"<td>{_e(r.precision)}</td>"]
        if labeled:
            cells += [f'<td class="num">{_pct(r.top1)}</td>', f'<td class="num">{_pct(r.top5)}</td>']
        cells += [
            f'<td class="num">{_pct(r.agreement)}</td>',
            f'<td class="num">{r.max_abs_diff:.2e}</td>',
            f'<td class="num">{r.mean_abs_diff:.2e}</td>',
            f'<td class="num">{r.cosine:.6f}</td>',
            f"<td>{_e(verdict)}</td>",
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return "<table>\n" + "\n".join(rows) + "\n</table>"


def _img(src: str, alt: str, width: int | None = None) -> str:
    w = f' width="{width}"' if width else ""
    return f'<img src="{_e(src)}" alt="{_e(alt)}"{w}>'


def check_report_dir(out_dir: str | Path) -> None:
    """Refuse (one line, exit 2) a --report folder that holds an index.html vitdeploy did not write: a user's page."""
    from vitdeploy.core.errors import UsageError

    index = Path(out_dir) / "index.html"
    if index.is_file():
        with open(index, encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
        if "<title>vitdeploy verify" not in head:
            raise UsageError(f"--report {out_dir} holds an index.html that is not a vitdeploy report: choose another "
                             "folder (it is never written over)")


def write_report(report: VerifyReport, out_dir: str | Path, max_disagreements: int = MAX_DISAGREEMENTS) -> Path:
    """Write ``index.html`` and its PNGs into ``out_dir``, all or nothing: built in a folder beside it and moved in
    at the end, so a failure (a full disk) leaves no half-written report. Returns the page's path."""
    import shutil

    from vitdeploy.core.fileio import move_into, temp_dir_beside

    final = Path(out_dir)
    if final.exists() and not final.is_dir():
        raise VitdeployError(f"--report {final}: a file, not a folder; pass a folder for index.html and its pictures")
    check_report_dir(final)
    tmp = temp_dir_beside(final)
    try:
        _write_report(report, tmp, max_disagreements)
        move_into(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final / "index.html"


def _write_report(report: VerifyReport, out_dir: str | Path, max_disagreements: int = MAX_DISAGREEMENTS) -> Path:
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise VitdeployError(f"--report {out}: a file, not a folder; pass a folder for index.html and its pictures")
    out.mkdir(parents=True, exist_ok=True)
    labeled = report.labels is not None and len(report.labels) == len(report.paths)
    names = report.class_labels
    ref = report.reference

    def label(i: int) -> str:
        return names[i] if 0 <= i < len(names) else str(i)

    body: list[str] = []
    verdict = '<span class="verdict pass">PASS</span>' if report.passed else '<span class="verdict fail">FAIL</span>'
    body.append(f"<h1>vitdeploy verify {verdict}</h1>")
    body.append(
        f'<p class="muted">{len(report.paths)} images from <code>{_e(report.images)}</code>'
        f"{' (labeled)' if labeled else ' (unlabeled: agreement only)'} · reference <code>{_e(ref.artifact)}</code></p>"
    )
    if report.failures:
        body.append("<ul>" + "".join(f"<li>outside tolerance: {_e(f)}</li>" for f in report.failures) + "</ul>")
    tols = [f"{_e(_short(r.artifact))}: {_e(r.tolerance.describe())}" for r in report.candidates if r.tolerance]
    if tols:
        body.append('<p class="muted">tolerance — ' + " · ".join(tols) + "</p>")
    body.append(_table(report))
    for n in report.notes:
        body.append(f'<p class="muted">note: {_e(n)}</p>')
    if report.skipped:
        body.append(f'<p class="muted">{len(report.skipped)} unreadable image(s) skipped: '
                    + ", ".join(_e(p) for p, _ in report.skipped[:10]) + ("…" if len(report.skipped) > 10 else "") + "</p>")

    body.append("<h2>Accuracy and agreement</h2>")
    plot_accuracy(report, out / "accuracy.png")
    body.append(f'<div class="plots">{_img("accuracy.png", "accuracy and agreement per artifact")}</div>')

    body.append("<h2>|Δlogit| against the reference</h2>")
    figs = []
    for k, cand in enumerate(report.candidates, start=1):
        name = f"delta_{k}.png"
        plot_delta_histogram(cand, ref, out / name)
        figs.append(_img(name, f"|Δlogit| histogram of {cand.artifact}"))
    body.append('<div class="plots">' + "".join(figs) + "</div>")

    if labeled:
        assert report.labels is not None
        body.append("<h2>Confusion matrices</h2>")
        figs = []
        for k, r in enumerate(report.results):
            name = f"confusion_{k}.png"
            plot_confusion(r, report.labels, names, out / name)
            figs.append(_img(name, f"confusion matrix of {r.artifact}"))
        body.append('<div class="plots">' + "".join(figs) + "</div>")

    body.append("<h2>Images where a candidate's top-1 differs from the reference's</h2>")
    ref_pred = ref.predictions
    ref_prob = softmax(ref.logits) if len(ref.logits) else ref.logits
    thumbs: dict[int, str] = {}
    for cand in report.candidates:
        pred = cand.predictions
        differ = np.flatnonzero(pred != ref_pred)
        body.append(f"<h3>{_e(cand.artifact)} ({_e(cand.precision)}): {len(differ)} of {len(pred)} images differ</h3>")
        if not len(differ):
            body.append('<p class="muted">none: every top-1 equals the reference\'s.</p>')
            continue
        prob = softmax(cand.logits)
        cells = []
        for i in differ[:max_disagreements]:
            i = int(i)
            if i not in thumbs:
                name = f"images/{len(thumbs):05d}.png"
                thumbs[i] = name if write_thumbnail(report.paths[i], out / name) else ""
            src = thumbs[i]
            pic = _img(src, Path(report.paths[i]).name) if src else '<div class="muted">(unreadable now)</div>'
            truth = f'<div class="truth">true: {_e(label(int(report.labels[i])))}</div>' if labeled else ""  # type: ignore[index]
            cells.append(
                f'<figure class="thumb" title="{_e(report.paths[i])}">{pic}<figcaption>'
                f'<div class="ref">reference: {_e(label(int(ref_pred[i])))} ({ref_prob[i, ref_pred[i]]:.0%})</div>'
                f'<div class="cand">candidate: {_e(label(int(pred[i])))} ({prob[i, pred[i]]:.0%})</div>'
                f"{truth}<div class=\"muted\">{_e(_short(report.paths[i], 18))}</div></figcaption></figure>"
            )
        body.append('<div class="grid">' + "".join(cells) + "</div>")
        if len(differ) > max_disagreements:
            body.append(f'<p class="muted">… and {len(differ) - max_disagreements} more.</p>')

    page = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>vitdeploy verify — {_e(_short(ref.artifact))}</title><style>{_CSS}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
    index = out / "index.html"
    write_text_atomic(index, page)
    return index
