"""verify on one image (issue 40, H): nearest-neighbour agreement asks whether each image's nearest other image is the
reference's, so on one image it is undefined (— in the table, null in JSON, a note, never judged), not 100%."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from vitdeploy.checks.judge import EmbeddingJudge
from vitdeploy.checks.verify import EmbeddingVerifyReport, judge_embeddings, nn_undefined_note
from vitdeploy.cli.verify import _embedding_rows
from vitdeploy.core.task import Task


def _report(n: int) -> EmbeddingVerifyReport:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((n, 8)).astype(np.float32)
    cand = ref + 0.01 * rng.standard_normal(ref.shape).astype(np.float32)
    task = Task("embedding", 8)
    results = judge_embeddings(EmbeddingJudge(task), ["model.onnx", "model.int8.onnx"], [ref, cand], None,
                               ["onnxruntime", "onnxruntime"], ["fp32", "int8"], [0.0, 0.0])
    return EmbeddingVerifyReport(task, results, [f"{i}.png" for i in range(n)], None, [], "imgs")


def _table(report: EmbeddingVerifyReport) -> str:
    t = Table()
    t.add_column("artifact")
    _embedding_rows(t, report)
    c = Console(width=200, record=True)
    c.print(t)
    return c.export_text()


def test_nearest_neighbour_agreement_is_undefined_on_one_image() -> None:
    rep = _report(1)
    d = rep.to_dict()["results"][1]
    assert d["nn_agreement"] is None and d["passed"] is True  # cosine judged, the neighbour not
    row = next(ln for ln in _table(rep).splitlines() if "model.int8.onnx" in ln)
    assert "100.00%" not in row and "—" in row, row
    assert "undefined on 1 image" in nn_undefined_note(1)


def test_nearest_neighbour_agreement_is_a_figure_on_two_images() -> None:
    rep = _report(2)
    assert rep.to_dict()["results"][1]["nn_agreement"] == 1.0
    assert "100.00%" in next(ln for ln in _table(rep).splitlines() if "model.int8.onnx" in ln)
