"""`vitdeploy check-target`: does an artifact stay within what a TensorRT line parses? (no TensorRT needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from vitdeploy.cli.app import app, console, emit_json, handle_errors
from vitdeploy.cli.options import JSON_HELP
from vitdeploy.core.errors import EXIT_FAILED, UsageError


@app.command("check-target")
@handle_errors
def check_target(
    models: list[Path] = typer.Argument(..., help="ONNX artifacts (export, convert-fp16, calibrate, bundle variants)."),
    target: Optional[list[str]] = typer.Option(None, "--target", "-t", help="trt8.5, trt8.6, trt10 or trt11, or a device that stands "
                                               "for one (jetpack6.1, jetpack5.1-agx-orin); repeatable; default: all four."),
    json_out: Optional[str] = typer.Option(None, "--json", metavar="FILE", help=JSON_HELP),
) -> None:
    """Check artifacts, our TensorRT calls and trtexec lines against each TensorRT line's own sources (the version table).

    Exit 1 when a target would refuse something; the findings name the node, the rule and its source.
    """
    from vitdeploy.checks import conformance as cf
    from vitdeploy.core.targets import TARGET_ROWS, resolve_target

    targets: list[str] = []
    for t in target or TARGET_ROWS:
        facts = resolve_target(t)  # a device name checks the TensorRT line it ships
        assert facts is not None
        if facts.name not in TARGET_ROWS:
            raise UsageError(f"--target {t}: check-target checks TensorRT lines: choose {', '.join(TARGET_ROWS)} or a JetPack")
        if facts.name not in targets:
            targets.append(facts.name)
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
    if not emit_json(results, json_out, list(models)):
        for r in results:
            state = "pass" if r["ok"] else f"FAIL ({len(r['findings'])})"
            console.print(f"{r['target']:7} {r['subject']}: {state}", highlight=False, soft_wrap=True, markup=False)
            for line in r["findings"][:5]:
                console.print(f"    {line}", highlight=False, soft_wrap=True, markup=False)
    if not all(r["ok"] for r in results):
        raise typer.Exit(EXIT_FAILED)
