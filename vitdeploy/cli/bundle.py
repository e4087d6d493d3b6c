"""`vitdeploy bundle` (`vitdeploy doctor` is in cli/doctor.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from vitdeploy.cli.app import app, console, err_console, handle_errors, say_target, text_column
from vitdeploy.cli.options import IMAGES_ALIAS_HELP, TARGET_NAMES, bounded

if TYPE_CHECKING:
    from rich.console import Console


@app.command()
@handle_errors
def bundle(
    models: Optional[list[Path]] = typer.Argument(
        None, help="ONNX artifacts (model.onnx, model.fp16.onnx, model.int8.onnx), or a checkpoint: then the whole path runs "
        "beside it (export, INT8 with the accuracy guard, FP16, verify on --images' labels; current artifacts reused). "
        "Default: those in this folder."
    ),
    out: Path = typer.Option(Path("bundle"), "--out", "-o", help="Folder to write (replaced only with --force, and only when complete)."),
    precision: Optional[str] = typer.Option(None, help="Precision the engine, run.py, Triton and DeepStream use (default: int8, else fp16, else fp32; an INT8 "
                                     "outside its budget by the guard's verdict is never the default: fp16 is, and "
                                     "--precision int8 is refused, exit 1)."),
    name: Optional[str] = typer.Option(None, help="Triton model name (default: the manifest's name)."),
    min_batch: int = typer.Option(1, **bounded("engine_batch"), help="Engine profile: smallest batch."),
    opt_batch: int = typer.Option(8, **bounded("engine_batch"), help="Engine profile: the batch TensorRT tunes for; DeepStream's batch-size."),
    max_batch: int = typer.Option(32, **bounded("engine_batch"), help="Engine profile: largest batch; Triton's max_batch_size."),
    images: Optional[list[Path]] = typer.Option(
        None, "--images", "-i", help="Images (files or folders) for the reference logits run.py --check compares against. "
        "Default: calibration/."
    ),
    check_images: Optional[list[Path]] = typer.Option(None, "--check-images", hidden=True, help=IMAGES_ALIAS_HELP),
    references: int = typer.Option(16, **bounded("references"), help="How many reference images to keep (at most 1000)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing bundle: only the files it wrote; "
                               "your files are kept (engines of earlier models moved to earlier/), each named."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help=f"What the bundle is for: {TARGET_NAMES}. Every model must "
                                         "have been made for it. Default: the models' own target."),
    int8: bool = typer.Option(False, "--int8", help="From a checkpoint: make (or reuse) the INT8 model only, besides FP32."),
    fp16: bool = typer.Option(False, "--fp16", help="From a checkpoint: make (or reuse) the FP16 model only, besides FP32."),
    quantizer: str = typer.Option("vitdeploy", "--quantizer", help="From a checkpoint: who makes the INT8, as calibrate's "
                                  "--quantizer: vitdeploy (ours, the default) or nncf (NNCF's, for -t cpu/openvino)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write what was bundled (files, precisions, the default and "
                                            "why, the INT8's verdict on its budget, the receipt, notes) to FILE "
                                            "('-': stdout, the tables then go to stderr)."),
    gallery: Optional[Path] = typer.Option(None, "--gallery", help="An embedding model: an index of its checkpoint's "
                                           "embeddings (vitdeploy index, FILE.faiss) whose vectors (float16, up to 1M x "
                                           "128-d) and classes the bundle ships; run.py labels images by their kNN vote."),
) -> None:
    """Write a self-contained folder for a Jetson, Triton or DeepStream: ONNX + raw-pixel variants, labels, run.py, build_engine.sh.

    The default precision is INT8 when the INT8 is within its budget by the guard's verdict, measured on all of
    --images (the receipt shows that verdict; the reference images only check that the device reproduces the
    references). An INT8 outside its budget is never the default: FP16 is, and a note says why (--precision int8 is
    then refused, exit 1)."""
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    from vitdeploy.core.errors import UsageError
    from vitdeploy.core.fileio import check_output, names_stdout
    from vitdeploy.stages.bundle import BundleOptions
    from vitdeploy.stages.bundle import bundle as make_bundle

    if quantizer not in ("vitdeploy", "nncf"):
        raise UsageError(f"--quantizer {quantizer!r}: choose vitdeploy or nncf")
    target = say_target(target)
    check_images = [*(images or []), *(check_images or [])]
    check_output(out, models or [], kind="dir")
    to_stdout = names_stdout(json_out)
    if json_out is not None and not to_stdout:
        check_output(json_out, [*(models or []), *check_images], option="--json")
        if json_out.resolve().is_relative_to(out.resolve()):
            raise UsageError(f"--json {json_out} is inside -o {out}, which the bundle replaces whole: write it outside")
    show = err_console if to_stdout else console  # '-': stdout carries the JSON alone
    opts = BundleOptions(
        name=name, precision=precision, min_batch=min_batch, opt_batch=opt_batch, max_batch=max_batch,
        check_images=tuple(check_images or ()), references=references, force=force, target=target, gallery=gallery,
    )
    if gallery is not None:
        from vitdeploy.stages.bundle_gallery import check_gallery_size

        check_gallery_size(gallery)  # before any work: the index, its classes, the size a bundle ships
    prepared = None
    if models and len(models) == 1 and models[0].suffix in (".pth", ".pt"):
        # one command from a checkpoint: export, INT8 and FP16 beside it (reused while current), verify, pack; every
        # option of that whole path is checked before its first artifact is touched
        from vitdeploy.stages.prepare import check_before_work, prepare

        check_before_work(models[0], check_images[0] if check_images else None, target, int8, fp16, quantizer, opts, out)
        with Progress(SpinnerColumn(), text_column("bundle", "bold"), text_column("{task.description}"), TimeElapsedColumn(),
                      console=err_console, transient=True, disable=not err_console.is_terminal) as prog:
            task = prog.add_task("starting", total=None)
            prepared = prepare(models[0], check_images[0] if check_images else None, target,
                               int8=int8 or not fp16, fp16=fp16 or not int8,
                               say=lambda msg: prog.update(task, description=msg), quantizer=quantizer)
        models = prepared.models
        opts.int8_verdict = prepared.verdict  # the guard's verdict on all of --images: the one the receipt shows
    elif int8 or fp16 or quantizer != "vitdeploy":
        raise UsageError("--int8/--fp16/--quantizer choose what to make from a checkpoint: pass CKPT (or the ONNX models "
                         "themselves)")
    with Progress(SpinnerColumn(), text_column("bundle", "bold"), text_column("{task.description}"), TimeElapsedColumn(),
                  console=err_console, transient=True, disable=not err_console.is_terminal) as prog:
        task = prog.add_task("starting", total=None)
        result = make_bundle(models or [], out, opts, progress=lambda msg: prog.update(task, description=msg))
    errs = ", ".join(f"{p} {e:.1e}" for p, e in result.embed_errors.items())
    show.print(
        f"wrote {result.out}/ ({len(result.files)} files): {', '.join(result.precisions)}; engine, run.py, Triton and "
        f"DeepStream use {result.default_precision}", highlight=False, soft_wrap=True,
    )
    what = "Δ" if result.is_embedding else "Δlogit"
    show.print(f"raw-pixel variants agree with their sources (max |{what}| relative): {errs}", highlight=False, soft_wrap=True)
    show.print(f"reference images: {result.reference_source}", highlight=False, soft_wrap=True)
    if result.verdict is not None:  # the one verdict on the INT8's budget: the guard's, on its image set
        show.print(f"INT8 budget: {result.verdict.line()}", highlight=False, soft_wrap=True, markup=False)
    for note in result.notes:
        show.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)
    for line in result.kept:  # --force over an earlier bundle: what it did not write stays (stages/bundle_replace.py)
        show.print(f"--force: {line}", highlight=False, soft_wrap=True, markup=False)
    if result.judged:  # an embedding model: judged by cosine to FP32 (checks/judge.py), no top-1 to show
        _embedding_table(result, prepared, show)
    elif prepared is not None:
        _receipt(prepared, result, show)
    if json_out is not None:
        from vitdeploy.cli.app import emit_json

        emit_json(bundle_document(result, prepared), json_out, [*(models or []), *check_images])
        if not to_stdout:
            show.print(f"results → {json_out}", highlight=False, soft_wrap=True)
    if result.matrix:
        show.print(f"next, on the device: cd {result.out} && ./build_engine.sh && python3 run.py --check",
                   highlight=False, soft_wrap=True)
    else:  # made for a CPU target: no TensorRT line, so no engine to build (build_engine.sh would refuse)
        show.print(f"next, on the device: cd {result.out} && python3 run.py --check (a CPU bundle: run.py runs the "
                   "ONNX with OpenVINO or ONNX Runtime; there is no engine to build)", highlight=False, soft_wrap=True)
    if len(result.matrix) > 1:
        show.print("build_engine.sh finds the TensorRT version and builds the file made for it "
                   f"(see {result.out}/README.md; ./build_engine.sh --dry-run --trt 8.5 shows the line)",
                   highlight=False, soft_wrap=True)
    if result.skipped:  # the bundle is whole, its reference set made of the readable images: partly done
        from vitdeploy.core.errors import PartlyDone

        raise PartlyDone(f"{len(result.skipped)} unreadable reference image(s) skipped (named above); the bundle is "
                         "written with readable ones in their place")



def bundle_document(result: object, prepared: object | None) -> dict:
    """``bundle --json``: what was written, the default precision and why, the INT8's one verdict on its budget, the
    receipt (from a checkpoint: what was made or reused, measured on --images), an embedding model's rows on the
    reference images, notes and skipped reference images."""
    from vitdeploy.stages.bundle import BundleResult
    from vitdeploy.stages.prepare import Prepared

    assert isinstance(result, BundleResult)
    doc: dict = {
        "out": str(result.out), "files": result.files, "task": result.task, "precisions": result.precisions,
        "default_precision": result.default_precision, "default_why": result.default_why or None,
        "int8_verdict": result.verdict.to_dict() if result.verdict is not None else None,
        "target": _written_target(result.out),
        "tensorrt_lines": sorted(result.matrix), "reference_source": result.reference_source,
        "raw_variant_max_rel_diff": result.embed_errors, "reference_runner": result.reference_runner,
        "judged_on_references": result.judged, "notes": result.notes, "kept": result.kept,
        "skipped": [{"path": p, "why": why} for p, why in result.skipped],
    }
    if isinstance(prepared, Prepared):
        doc["receipt"] = [{**r, "made": r["artifact"] in prepared.made} for r in prepared.rows]
        doc["prepare_notes"] = prepared.notes
    return doc


def _written_target(out: Path) -> str | None:
    """The target the bundle was made for, as its manifest.json says (None: no target, every TensorRT line)."""
    import json

    try:
        t = json.loads((out / "manifest.json").read_text()).get("target")
    except (OSError, ValueError, AttributeError):
        return None
    return t if isinstance(t, str) else None


def _verdict_cell(artifact: str, result: object) -> str:
    """The receipt's verdict for a row: the INT8's one verdict on its budget (the guard's, on its image set)."""
    from vitdeploy.stages.bundle import BundleResult

    assert isinstance(result, BundleResult)
    if not artifact.endswith(".int8.onnx") or result.verdict is None:
        return ""
    v = result.verdict
    return v.label() + (f" ({v.images} images)" if v.images else "")


def _receipt(prepared: object, result: object, show: Console) -> None:
    """One table: artifact | target | top-1 | drop | agreement | size (what was made, reused and measured)."""
    from rich.table import Table

    from vitdeploy.stages.bundle import BundleResult
    from vitdeploy.stages.prepare import Prepared

    assert isinstance(prepared, Prepared) and isinstance(result, BundleResult)
    t = Table(title="receipt", title_justify="left")
    for col in ("artifact", "target", "top-1", "drop", "agreement", "size", "", "budget (guard)"):
        t.add_column(col)
    for r in prepared.rows:
        t.add_row(r["artifact"], r["target"],
                  "—" if r["top1"] is None else f"{100 * r['top1']:.2f}%",
                  "—" if r["drop"] is None else f"{r['drop']:+.2f} pts",
                  "—" if r["agreement"] is None else f"{100 * r['agreement']:.2f}%",
                  f"{r['size'] / 1e6:.2f} MB", "made" if r["artifact"] in prepared.made else "reused (current)",
                  _verdict_cell(r["artifact"], result))
    show.print(t, highlight=False, soft_wrap=True)
    for note in prepared.notes:
        show.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)


def _embedding_table(result: object, prepared: object | None, show: Console) -> None:
    """An embedding model's receipt: artifact | runner | cosine mean | p1 | min | NN agreement | budget | verdict (each
    precision against FP32 on the reference images, by checks/judge.py), with size and made/reused from a checkpoint."""
    from rich.table import Table

    from vitdeploy.stages.bundle import BundleResult
    from vitdeploy.stages.prepare import Prepared

    assert isinstance(result, BundleResult)
    rows = {r["artifact"]: r for r in prepared.rows} if isinstance(prepared, Prepared) else {}
    made = set(prepared.made) if isinstance(prepared, Prepared) else set()
    t = Table(title=f"receipt: {result.task}, each precision vs FP32 (figures on {result.judged[0]['rows']} reference "
              "images; the INT8's verdict is the guard's, on its image set)", title_justify="left")
    for col in ("artifact", "runner", "cosine mean", "p1", "min", "NN agreement", "budget (mean/p1/NN)", "verdict",
                "judged on", *(("size", "") if rows else ())):
        # the names and runners whole (a narrow terminal wraps the other cells instead)
        width = max(len(str(j[col])) for j in result.judged) if col in ("artifact", "runner") else (
            len("0.999/0.995/97%") if col.startswith("budget") else None)
        t.add_column(col, min_width=width)
    for j in result.judged:
        b = j["budget"]
        verdict = {"reference": "reference", "within": "within budget", "outside": "OUTSIDE BUDGET"}.get(
            j["verdict"], "not judged")
        extra: tuple[str, ...] = ()
        if rows:
            r = rows.get(j["artifact"])
            extra = ("—", "") if r is None else (
                f"{r['size'] / 1e6:.2f} MB", "made" if r["artifact"] in made else "reused (current)")
        t.add_row(j["artifact"], j["runner"], f"{j['cosine_mean']:.5f}", f"{j['cosine_p1']:.5f}", f"{j['cosine_min']:.5f}",
                  f"{100 * j['nn_agreement']:.1f}%", "—" if j["reference"] else
                  f"{b['min_cosine']}/{b['min_cosine_p1']}/{100 * b['min_nn_agreement']:.0f}%", verdict,
                  j.get("judged_on") or "—", *extra)
    show.print(t, highlight=False, soft_wrap=True)
    if isinstance(prepared, Prepared):
        for note in prepared.notes:
            show.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)
