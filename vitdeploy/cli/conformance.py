"""`vitdeploy check-target`: does an artifact stay within what a TensorRT line parses? (no TensorRT needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from vitdeploy.cli.app import app, console, handle_errors
from vitdeploy.core.errors import EXIT_FAILED, UsageError


@app.command("check-target")
@handle_errors
def check_target(
    models: list[Path] = typer.Argument(..., help="ONNX artifacts (export, convert-fp16, calibrate, bundle variants)."),
    target: Optional[list[str]] = typer.Option(None, "--target", "-t", help="trt8.5, trt8.6, trt10 or trt11 (repeatable; default: all)."),
    json_out: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
) -> None:
    """Check artifacts, our TensorRT calls and trtexec lines against each TensorRT line's own sources (the version table).

    Exit 1 when a target would refuse something; the findings name the node, the rule and its source.
    """
    from vitdeploy.checks import conformance as cf
    from vitdeploy.core.targets import TARGET_ROWS

    targets = list(target or TARGET_ROWS)
    for t in targets:
        if t not in TARGET_ROWS:
            raise UsageError(f"--target {t}: choose one of {', '.join(TARGET_ROWS)}")
    for m in models:
        if not m.exists():
            raise UsageError(f"{m}: no such file")
    results: list[dict[str, Any]] = []
    for t in targets:
        reps = [cf.check_onnx(m, t) for m in models] + [cf.check_int8_intent(m, t) for m in models]
        reps += [cf.check_python_names(t), cf.check_printed_trtexec(t)]
        for rep in reps:
            results.append({"target": t, "subject": rep.subject, "ok": rep.ok, "notes": rep.notes,
                            "findings": [f.line() for f in rep.findings]})
    if json_out:
        typer.echo(json.dumps(results, indent=2))
    else:
        for r in results:
            state = "pass" if r["ok"] else f"FAIL ({len(r['findings'])})"
            console.print(f"{r['target']:7} {r['subject']}: {state}", highlight=False, soft_wrap=True, markup=False)
            for line in r["findings"][:5]:
                console.print(f"    {line}", highlight=False, soft_wrap=True, markup=False)
    if not all(r["ok"] for r in results):
        raise typer.Exit(EXIT_FAILED)
