"""`vitdeploy doctor`: what this machine can run, in plain words (styles only where a terminal shows them)."""

from __future__ import annotations

from typing import Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from vitdeploy.cli.app import app, check_json_dest, console, emit_json, handle_errors, styled

# How each verdict is styled on a terminal; the words alone reach a pipe or a log (rich drops styles there).
VERDICT_STYLE = {"yes": "green", "partly": "yellow", "no": "red"}


def verdict(word: str) -> Text:
    """A verdict as a styled word, never as markup text such as ``[yellow]partly[/]``."""
    return Text(word, style=VERDICT_STYLE.get(word, ""))


@app.command()
@handle_errors
def doctor(
    json_out: Optional[str] = typer.Option(None, "--json", metavar="FILE",
                                           help="Also write the report as JSON to FILE ('-': the JSON alone, on stdout)."),
) -> None:
    """What this machine can do: packages, the backends `auto` picks (OpenVINO, ONNX Runtime, TensorRT, torch), GPU, Jetson/JetPack, DLA, and which commands work."""
    from vitdeploy.tools.doctor import doctor as run_doctor

    check_json_dest(json_out)
    rep = run_doctor()
    if emit_json(rep.to_dict(), json_out):
        return
    console.print(machine_table(rep), highlight=False, soft_wrap=True)
    console.print(backend_table(rep.backends), highlight=False, soft_wrap=True)
    ct = Table(title="vitdeploy commands here", title_justify="left")
    ct.add_column("command")
    ct.add_column("works")
    ct.add_column("")
    for row in rep.commands:
        ct.add_row(row["command"], verdict(row["works"]), Text(row["why"]))
    console.print(ct, highlight=False, soft_wrap=True)


def backend_table(backends: list[dict[str, Any]]) -> Table:
    """One row a backend: whether it runs here, what `auto` gives it, and why not."""
    bt = Table(title="backends (what auto picks)", title_justify="left")
    bt.add_column("backend")
    bt.add_column("works")
    bt.add_column("auto picks it for")
    bt.add_column("")
    for b in backends:
        note = f"{b['version']}" if b["available"] and b.get("version") else (b.get("why") or "")
        bt.add_row(b["backend"], verdict("yes" if b["available"] else "no"), Text(b["auto_picks"] or "-"), Text(note))
    return bt


def machine_table(rep: Any) -> Table:
    """Python, packages, TensorRT, GPU, Jetson, DLA and target, one row each."""
    t = Table(title="this machine", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    py = rep.python
    t.add_row("python", Text(f"{py['version']} ({py['machine']}, {py['system']})"))
    t.add_row("packages", Text("  ".join(f"{k} {v}" for k, v in rep.packages.items() if v) or "-"))
    o = rep.onnxruntime
    t.add_row("onnxruntime", Text(f"{o['version']}: {', '.join(o['providers'])}") if o["available"]
              else styled("missing:", "red", o["why"]))
    r = rep.tensorrt
    trt = Text(f"{r['version']}") if r["available"] else styled("missing:", "red", r["why"])
    trt.append(f"; trtexec {r['trtexec']}" if r.get("trtexec") else "; no trtexec")
    t.add_row("tensorrt", trt)
    c = rep.cuda
    if c["available"]:
        gpus = "; ".join(f"{g['name']} (compute {g['compute_capability']}, {g['memory_gib']} GiB)" for g in c["gpus"])
        t.add_row("gpu", Text(f"{gpus}; driver CUDA {c['driver_cuda_version']}"
                              + (f", driver {c['driver_version']}" if c.get("driver_version") else "")))
    else:
        t.add_row("gpu", styled("missing:", "red", c["why"]))
    j = rep.jetson
    if j["is_jetson"]:
        jp = f"JetPack {j['jetpack']} (TensorRT {j['jetpack_tensorrt']})" if j.get("jetpack") else "JetPack unknown for this L4T"
        t.add_row("jetson", Text(f"{j.get('model') or 'Jetson'}; L4T {j.get('l4t') or '?'}; {jp}"))
    else:
        t.add_row("jetson", "no")
    t.add_row("dla", f"{rep.dla['cores']} core(s)")
    tg = rep.target
    if tg.get("target"):
        dla = {True: "DLA", False: "no DLA", "unconfirmed": "DLA unconfirmed"}.get(tg["dla"], "")
        kinds = ", ".join(f"{k} {v if v == 'yes' else 'artifact only'}" for k, v in tg["engines"].items())
        t.add_row("target", Text(f"{tg['target']} (TensorRT {tg['tensorrt']}, {tg['from']}; opset ≤ {tg['max_opset']}; "
                                 f"{dla}); engines: {kinds}"))
    else:
        t.add_row("target", Text(f"none: {tg.get('why', '')}"))
    return t
