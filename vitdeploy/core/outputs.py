"""Every file a command writes is an output: ``-o`` and each file written beside it, under one rule.

A side output (a features cache, a calibration cache, a sidecar, a file list, a checkpoint's best-so-far) is named
from ``-o``, so a user never typed its name, and before this module none was checked: a link left where the
features cache goes (``p.pth.features.npz -> dinov2.pth``) turned the --init weights into an npz with exit 0. The
rule, for ``-o`` and for every side output alike:

- checked before any work by ``fileio.check_output`` (one line, exit 2): not an input, not a symlink or a hard link
  to one, not a file of an input folder, a place writable here;
- written by ``fileio.atomic_path`` (or into a folder from ``fileio.temp_dir_beside``): a temporary file renamed into
  place, so a link at the destination is replaced, never written through, and a hard link's other name keeps its
  bytes.

``SIDE_OUTPUTS`` names each side output and how its name follows from the output it sits beside; every writer asks
``side_output_path`` for the name and the command checks them all with ``check_side_outputs``. ``WRITERS`` declares
every function in vitdeploy that writes a file and what it writes; tests/test_side_outputs.py reads the code and
fails on a writer that is not declared, so a new sidecar cannot skip the check unnoticed.

The bundle's run.py and C++ example cannot import vitdeploy: they carry their own copy of the rule
(``run.py``'s ``out_refusal``, ``cpp/common.hpp``'s ``out_refusal``), tested to agree with ``output_refusal`` here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SideOutput:
    """A file a command writes beside its main output, under a name derived from it."""

    what: str  # as a message names it
    beside: str  # the command and option whose output it sits beside
    name: Callable[[Path], Path]  # its path from the main output's


def _suffixed(suffix: str) -> Callable[[Path], Path]:
    return lambda o: o.with_name(o.name + suffix)


def _calib(o: Path) -> Path:
    from vitdeploy.core.naming import calib_cache_name

    return calib_cache_name(o)


def _raw(o: Path) -> Path:
    from vitdeploy.core.naming import raw_variant_name

    return o.with_name(raw_variant_name(o.name))


def _gallery_json(o: Path) -> Path:
    from vitdeploy.core.gallery import sidecars

    return sidecars(o)[0]


def _gallery_ids(o: Path) -> Path:
    from vitdeploy.core.gallery import sidecars

    return sidecars(o)[1]


def _files_list(o: Path) -> Path:
    return o.with_name(o.name[: -len(o.suffix)] + ".files.txt")


SIDE_OUTPUTS: dict[str, SideOutput] = {
    "features cache": SideOutput("the features cache", "train --probe -o", _suffixed(".features.npz")),
    "partial checkpoint": SideOutput("the best-so-far checkpoint", "train -o", _suffixed(".partial")),
    "calibration cache": SideOutput("the calibration cache", "calibrate -o", _calib),
    "external data": SideOutput("the external weights file", "export -o", _suffixed(".data")),
    "raw variant": SideOutput("the raw-pixel variant", "export --embed-preprocess -o", _raw),
    "engine sidecar": SideOutput("the engine's sidecar", "build-engine -o", _suffixed(".json")),
    "rejected engine": SideOutput("the rejected plan", "build-engine -o", _suffixed(".rejected")),
    "rejected engine sidecar": SideOutput("the rejected plan's sidecar", "build-engine -o", _suffixed(".rejected.json")),
    "files list": SideOutput("the file-name list", "infer -o FILE.npy", _files_list),
    "gallery record": SideOutput("the index's record", "index -o FILE.faiss", _gallery_json),
    "gallery ids": SideOutput("the index's id table", "index -o FILE.faiss", _gallery_ids),
}

# Every function in vitdeploy (bundle_files aside: run.py and the C++ example keep their own rule) that writes a
# file, and what it writes: MAIN, an output an option names (checked by check_output where the command parses it);
# TEMP, files inside a private temporary folder (temp_dir_beside's, a TemporaryDirectory, atomic_path's temporary
# file) that only a rename puts in place; or the SIDE_OUTPUTS it writes.
MAIN = "an option's output"
TEMP = "a private temporary file or folder"
WRITERS: dict[str, tuple[str, ...]] = {
    "vitdeploy.checks.report:_save": (TEMP,),  # the report's files, inside write_report's temporary folder
    "vitdeploy.checks.report:write_thumbnail": (TEMP,),
    "vitdeploy.checks.report:write_report": (MAIN,),  # verify --report DIR
    "vitdeploy.checks.report:_write_page": (TEMP,),
    "vitdeploy.cli.app:emit_json": (MAIN,),  # --json FILE of every reporting command
    "vitdeploy.cli.bench:benchmark": (MAIN,),
    "vitdeploy.cli.explain:explain": (MAIN,),
    "vitdeploy.cli.numerics:numerics": (MAIN,),
    "vitdeploy.cli.verify:verify": (MAIN,),
    "vitdeploy.core.artifact:OnnxArtifact.write": (MAIN, "raw variant"),  # calibrate / convert-fp16 -o, embed
    "vitdeploy.graph.cleanup:check_graph": (TEMP,),  # onnx.checker's copy, in a TemporaryDirectory
    "vitdeploy.model.checkpoint:save_checkpoint": (MAIN, "partial checkpoint"),
    "vitdeploy.model.data:write_digits": (MAIN,),
    "vitdeploy.model.probe:_write_cache": ("features cache",),
    "vitdeploy.model.train:keep_earlier_partial": ("partial checkpoint",),
    "vitdeploy.model.train:_train": (MAIN, "partial checkpoint"),
    "vitdeploy.runners.openvino.loader:compile_model_proto": (TEMP,),
    "vitdeploy.runners.tensorrt.builder:compile_engine": (MAIN, "engine sidecar", "rejected engine",
                                                          "rejected engine sidecar"),
    "vitdeploy.stages.bundle:reference_images": (TEMP,),  # inside the bundle's temporary folder
    "vitdeploy.stages.bundle:bundle": (MAIN,),
    "vitdeploy.stages.bundle:_write_bundle": (TEMP,),
    "vitdeploy.stages.bundle_configs:write_cpp": (TEMP,),
    "vitdeploy.stages.bundle_replace:replace_bundle": (MAIN,),
    "vitdeploy.stages.export:_save_model": (TEMP,),
    "vitdeploy.stages.export:_torch_export": (TEMP,),  # in memory, or in export_onnx's temporary folder
    "vitdeploy.stages.export:_move_into_place": (MAIN, "external data"),
    "vitdeploy.stages.export:export_onnx": (MAIN,),
    "vitdeploy.stages.precision:_write_cache": ("calibration cache",),
    "vitdeploy.tools.bench:nncf_anchor": (TEMP,),
    "vitdeploy.tools.bench:_random_images": (TEMP,),
    "vitdeploy.tools.explain:explain": (MAIN,),
    "vitdeploy.tools.infer:write_embeddings": (MAIN, "files list"),
    "vitdeploy.tools.index:build_index": (MAIN, "gallery record", "gallery ids"),  # index -o FILE.faiss
    "vitdeploy.tools.corpus.sink:write_shard": (MAIN,),  # infer -o DIR/: part-NNNNN.parquet (DIR checked as a folder)
    "vitdeploy.tools.corpus.sink:write_errors": (MAIN,),  # DIR/errors.parquet
    "vitdeploy.tools.corpus.ray_exec:ModelActor.__init__": (TEMP,),  # the shipped model, in a mkdtemp folder
    "vitdeploy.stages.bundle_gallery:ship_gallery": (TEMP,),  # inside the bundle's temporary folder
    "vitdeploy.tools.infer:write_predictions": (MAIN,),
}


def side_output_path(kind: str, out: str | Path) -> Path:
    """Where the side output ``kind`` of a command writing ``out`` goes (the one place its name is derived)."""
    return SIDE_OUTPUTS[kind].name(Path(out))


def check_side_outputs(out: str | Path, kinds: Iterable[str], inputs: Iterable[str | Path | None] = (),
                       option: str = "-o") -> list[Path]:
    """``fileio.check_output`` on each side output of ``out``, before any work: a side output that is an input (or a
    link or hard link to one) is refused in one line (exit 2) naming it, the input, and what to do."""
    from vitdeploy.core.errors import UsageError
    from vitdeploy.core.fileio import check_output

    given = [i for i in inputs if i is not None]
    paths = []
    for kind in kinds:
        side = SIDE_OUTPUTS[kind]
        p = side.name(Path(out))
        try:
            check_output(p, given, option=side.what)
        except UsageError as e:  # check_output's line, with the ways out of a name the user never typed
            why = str(e).replace(": write the result elsewhere (inputs are never written over)", "")
            raise UsageError(f"{why}; it is written beside {option} {out}: remove {p.name} or choose another "
                             f"{option} (inputs are never written over)") from None
        paths.append(p)
    return paths


def output_refusal(out: str | Path, inputs: Iterable[str | Path] = (), listed: Iterable[str | Path] = ()) -> str:
    """The rule run.py and the C++ example copy, as one reason ('' when ``out`` may be written): ``check_output``'s
    (not an input, nor a symlink or hard link to one, nor an existing file of an input folder), and not one of a
    bundle's listed files (``listed``: manifest.json and the files it lists, which --check compares against), by its
    name or through a link. Kept here so that tests hold the copies to it; vitdeploy's own commands call
    check_output."""
    from vitdeploy.core.errors import UsageError
    from vitdeploy.core.fileio import check_output, same_file

    try:
        check_output(out, list(inputs), option="--out")
    except UsageError as e:
        return str(e)
    o = Path(out)
    for f in listed:
        if _spot(o) == _spot(Path(f)) or (Path(f).exists() and o.exists() and same_file(o, f)):
            return f"--out {out} is the bundle's own {f}"
    return ""


def same_name(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one directory entry (their folders resolved, the last parts as given): a link at one
    to the other is not the same name."""
    return _spot(Path(a)) == _spot(Path(b))


def _spot(p: Path) -> str:
    """Where a path's name sits: its folder resolved, its last part as given (a link there is not followed)."""
    import os

    a = os.path.abspath(p)
    return os.path.join(os.path.realpath(os.path.dirname(a)), os.path.basename(a))
