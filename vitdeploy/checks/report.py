"""The verify report as an HTML page with plots a person reads at a glance.

``write_report(report, out_dir)`` turns a ``VerifyReport`` into ``index.html``
plus PNGs beside it: accuracy and agreement per artifact (bars), a histogram of
|Δlogit| per candidate against the reference, a confusion matrix per artifact
(when the images are labeled), and thumbnails of the images on which a
candidate's top-1 differs from the reference's, with both labels.

An embedding model's report (``EmbeddingVerifyReport``) shows its figures instead: the per-image cosine to the
reference (each candidate's images sorted, against its budget), kNN top-1 and nearest-neighbour agreement (bars), the
images with the lowest cosine, and, where the artifacts have patch tokens, the per-patch cosine map over one image.

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

    from vitdeploy.checks.verify import ArtifactResult, EmbeddingVerifyReport, VerifyReport

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



def _notes(notes: list[str], skipped: list[tuple[str, str]]) -> list[str]:
    """The report's notes, then the line naming the unreadable images it passed over (the first ten)."""
    out = [f'<p class="muted">note: {_e(n)}</p>' for n in notes]
    if skipped:
        out.append(f'<p class="muted">{len(skipped)} unreadable image(s) skipped: '
                   + ", ".join(_e(p) for p, _ in skipped[:10]) + ("…" if len(skipped) > 10 else "") + "</p>")
    return out


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


def write_report(report: VerifyReport | EmbeddingVerifyReport, out_dir: str | Path, max_disagreements: int = MAX_DISAGREEMENTS) -> Path:
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


def _write_report(report: VerifyReport | EmbeddingVerifyReport, out_dir: str | Path,
                  max_disagreements: int = MAX_DISAGREEMENTS) -> Path:
    from vitdeploy.checks.verify import EmbeddingVerifyReport

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise VitdeployError(f"--report {out}: a file, not a folder; pass a folder for index.html and its pictures")
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(report, EmbeddingVerifyReport):
        return _write_page(out, report.reference.artifact, _embedding_body(report, out, max_disagreements))
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
    body.extend(_notes(report.notes, report.skipped))

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

    return _write_page(out, ref.artifact, body)


def _write_page(out: Path, reference: str, body: list[str]) -> Path:
    page = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>vitdeploy verify — {_e(_short(reference))}</title><style>{_CSS}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
    index = out / "index.html"
    write_text_atomic(index, page)
    return index


# --- an embedding model's page -----------------------------------------------------------------------

WORST_IMAGES = 12  # the lowest-cosine images shown per candidate


def plot_cosine(report: EmbeddingVerifyReport, path: Path) -> Path:
    """Each candidate's per-image 1 − cosine to the reference, images sorted from the most to the least alike, on a
    log axis (FP16 sits near 1e-7, INT8 near 1e-4), with its budget's mean and 1st-percentile gates."""
    fig = _figure(6.4, 3.6)
    ax = fig.add_subplot()
    colors = ["#dd8452", "#4c72b0", "#55a868", "#c44e52", "#8172b3", "#937860"]
    floor = 1e-9  # an exact match (1 − cosine = 0) is drawn at the floor of the axis
    for k, r in enumerate(report.candidates):
        gap = np.maximum(1.0 - np.sort(r.comparison.per_image_cosine)[::-1], floor)
        x = np.linspace(0, 100, len(gap)) if len(gap) > 1 else np.zeros(1)
        color = colors[k % len(colors)]
        ax.plot(x, gap, color=color, lw=1.5, label=f"{_short(r.artifact)} ({r.precision})")
        if r.budget is not None:
            ax.axhline(max(1.0 - r.budget.min_cosine, floor), color=color, lw=1, ls="--")
            ax.axhline(max(1.0 - r.budget.min_cosine_p1, floor), color=color, lw=1, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("images, most alike first (%)")
    ax.set_ylabel("1 − cosine to the reference")
    ax.set_title("per-image cosine (dashed: the budget's mean, dotted: its 1st percentile)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_neighbours(report: EmbeddingVerifyReport, path: Path) -> Path:
    """Bars per artifact: nearest-neighbour agreement with the reference and, on class folders, kNN top-1."""
    results = report.results
    series: list[tuple[str, list[float], str]] = []
    if report.labels is not None:
        series.append(("kNN top-1 (k=20, leave-one-out)", [r.knn_top1 or 0.0 for r in results], "#4c72b0"))
    series.append(("nearest-neighbour agreement", [r.comparison.nn_agreement for r in results], "#55a868"))
    fig = _figure(max(5.0, 1.4 * len(results) + 2), 3.4)
    ax = fig.add_subplot()
    x = np.arange(len(results))
    width = 0.8 / len(series)
    for k, (label, vals, color) in enumerate(series):
        bars = ax.bar(x + (k - (len(series) - 1) / 2) * width, [v * 100 for v in vals], width, label=label, color=color)
        ax.bar_label(bars, labels=[f"{v:.1%}" for v in vals], fontsize=8, padding=2)
    ax.set_ylim(0, 116)
    ax.set_yticks([t for t in ax.get_yticks() if t <= 100])
    ax.set_xticks(x, [_short(r.artifact) for r in results], fontsize=8, rotation=0 if len(results) <= 4 else 20)
    ax.set_ylabel("%")
    ax.legend(loc="upper center", ncol=len(series), fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_patch_cosine(report: EmbeddingVerifyReport, path: Path) -> Path:
    """The image, then each candidate's per-patch cosine to the reference's patch tokens over it (one shared colour
    scale, so a worse map is visibly darker)."""
    from vitdeploy.core.preprocess import ImageReadError, load_image

    maps = [(r, r.patches) for r in report.candidates if r.patches is not None]
    image, view = maps[0][1].image, maps[0][1].view
    fig = _figure(2.6 * (len(maps) + 1) + 0.8, 2.9)
    axes = fig.subplots(1, len(maps) + 1)
    if view is None:  # the model's view was not kept: the file as it is on disk
        try:
            view = np.asarray(load_image(image))
        except ImageReadError:
            axes[0].text(0.5, 0.5, "(unreadable now)", ha="center", va="center", transform=axes[0].transAxes)
    if view is not None:
        axes[0].imshow(view)
    axes[0].set_title(f"{_short(image, 24)} (as the model sees it)", fontsize=8)
    lo = min(float(p.cosine.min()) for _, p in maps)
    lo = min(lo, 1.0 - 1e-6)  # a flat map of 1.0 still gets a scale
    im = None
    for ax, (r, p) in zip(axes[1:], maps, strict=True):
        im = ax.imshow(p.cosine, cmap="viridis", vmin=lo, vmax=1.0)
        ax.set_title(f"{_short(r.artifact, 20)} ({r.precision})\nmin {p.cosine.min():.6f}", fontsize=8)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    if im is not None:
        fig.colorbar(im, ax=list(axes[1:]), shrink=0.8, label="patch cosine")
    return _save(fig, path)


def _embedding_table(report: EmbeddingVerifyReport) -> str:
    labeled = report.labels is not None
    head = ["artifact", "backend", "precision"] + (["kNN top-1"] if labeled else [])
    head += ["cosine mean", "cosine p1", "cosine min", "rel. Frobenius", "NN agreement", "budget", "result"]
    rows = ["<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for r in report.results:
        c = r.comparison
        verdict = "reference" if r.is_reference else ("ok" if r.passed else "FAIL")
        b = r.budget
        budget = (f"mean ≥ {b.min_cosine:g}, p1 ≥ {b.min_cosine_p1:g}, NN ≥ {b.min_nn_agreement:.0%}" if b else "")
        cells = [f"<td>{_e(r.artifact)}</td>", f"<td>{_e(r.backend)}</td>", f"<td>{_e(r.precision)}</td>"]
        if labeled:
            cells.append(f'<td class="num">{_pct(r.knn_top1)}</td>')
        cells += [f'<td class="num">{c.cosine_mean:.6f}</td>', f'<td class="num">{c.cosine_p1:.6f}</td>',
                  f'<td class="num">{c.cosine_min:.6f}</td>', f'<td class="num">{c.rel_frobenius:.2e}</td>',
                  f'<td class="num">{_pct(c.nn_agreement if c.rows >= 2 else None)}</td>', f"<td>{_e(budget)}</td>", f"<td>{_e(verdict)}</td>"]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return "<table>\n" + "\n".join(rows) + "\n</table>"


def _embedding_body(report: EmbeddingVerifyReport, out: Path, worst: int) -> list[str]:
    labeled = report.labels is not None
    body: list[str] = []
    verdict = '<span class="verdict pass">PASS</span>' if report.passed else '<span class="verdict fail">FAIL</span>'
    body.append(f"<h1>vitdeploy verify {verdict}</h1>")
    body.append(
        f'<p class="muted">{_e(report.task.describe())} · {len(report.paths)} images from <code>{_e(report.images)}'
        f"</code>{' (class folders: kNN top-1, k=20, T=0.07, leave-one-out)' if labeled else ' (unlabeled: no kNN)'}"
        f" · reference <code>{_e(report.reference.artifact)}</code></p>"
    )
    if report.failures:
        body.append("<ul>" + "".join(f"<li>outside the budget: {_e(f)}</li>" for f in report.failures) + "</ul>")
    body.append(_embedding_table(report))
    body.extend(_notes(report.notes, report.skipped))

    body.append("<h2>Per-image cosine to the reference</h2>")
    plot_cosine(report, out / "cosine.png")
    plot_neighbours(report, out / "neighbours.png")
    body.append('<div class="plots">' + _img("cosine.png", "per-image cosine per candidate")
                + _img("neighbours.png", "kNN top-1 and nearest-neighbour agreement per artifact") + "</div>")

    if any(r.patches is not None for r in report.candidates):
        first = next(r.patches for r in report.candidates if r.patches is not None)
        assert first is not None
        body.append("<h2>Per-patch cosine over one image</h2>")
        body.append(f'<p class="muted">the patch tokens of <code>{_e(first.image)}</code>, the image the candidates '
                    "answer least like the reference, each against the reference's</p>")
        plot_patch_cosine(report, out / "patch_cosine.png")
        body.append(f'<div class="plots">{_img("patch_cosine.png", "per-patch cosine map")}</div>')

    body.append("<h2>Images with the lowest cosine</h2>")
    thumbs: dict[int, str] = {}
    for cand in report.candidates:
        cos = cand.comparison.per_image_cosine
        low = np.argsort(cos, kind="stable")[:worst]
        body.append(f"<h3>{_e(cand.artifact)} ({_e(cand.precision)})</h3>")
        cells = []
        for i in low:
            i = int(i)
            if i not in thumbs:
                name = f"images/{len(thumbs):05d}.png"
                thumbs[i] = name if write_thumbnail(report.paths[i], out / name) else ""
            pic = _img(thumbs[i], Path(report.paths[i]).name) if thumbs[i] else '<div class="muted">(unreadable now)</div>'
            truth = (f'<div class="truth">class: {_e(report.class_labels[int(report.labels[i])])}</div>'  # type: ignore[index]
                     if labeled else "")
            cells.append(f'<figure class="thumb" title="{_e(report.paths[i])}">{pic}<figcaption>'
                         f'<div class="cand">cosine {cos[i]:.6f}</div>{truth}'
                         f'<div class="muted">{_e(_short(report.paths[i], 18))}</div></figcaption></figure>')
        body.append('<div class="grid">' + "".join(cells) + "</div>")
    return body
