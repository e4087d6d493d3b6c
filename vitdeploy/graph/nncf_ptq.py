"""INT8 for a CPU by NNCF, OpenVINO's own post-training quantizer, on the ONNX graph (``calibrate --quantizer nncf``).

NNCF's transformer scheme (``model_type=TRANSFORMER``: SmoothQuant at its tuned α, MatMul/Conv inputs and the attention
scores quantized, LayerNorm/Softmax/GELU and the residual stream in float, asymmetric activations, mean-of-min/max
ranges, fast bias correction, the first layer's weights in 7 bits). It is an option, not the default: measured in
docs/cpu-backends.md, OpenVINO runs it no faster than our CPU placement on this project's machine, and it loses more
top-1 unguarded. NNCF's ONNX backend writes an ordinary Q/DQ ONNX graph, so the artifact keeps our manifest, lineage,
verify and accuracy guard (quantize.QuantizedGraphSwitch reverts its layers to float). It works from op types alone
(MatMul, Conv, Softmax, LayerNormalization patterns), so every ViT family the exporter writes gets it with no
per-family code.

nncf is an optional dependency (the ``cpu`` extra), imported only here and only when NNCF's INT8 is made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from vitdeploy.core.errors import VitdeployError

INSTALL = "pip install 'vitdeploy[cpu]' (or pip install nncf)"


def import_nncf() -> Any:
    """The nncf module, or one line saying how to install it.

    NNCF tells a model's backend apart by importing ``nncf.torch``, which imports ``torch.utils.cpp_extension``; on a
    machine with a CUDA toolkit but no GPU that module logs "No CUDA runtime is found, using CUDA_HOME=..." at import,
    a line about a GPU our CPU path never uses (issue 37, P11). Its logger is quieted to errors here, before that
    import, for our process only: every NNCF path (calibrate --quantizer nncf, bundle, --versus nncf) comes here."""
    import logging

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        import nncf
    except ImportError:
        raise VitdeployError(f"NNCF is not installed (--quantizer nncf, --versus nncf): {INSTALL}") from None
    return nncf


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """NNCF's INFO lines and progress bars (rich, on stdout) kept out of our output: ``--json -`` owns stdout, and
    our commands draw their own progress."""
    import io
    import logging

    log = logging.getLogger("nncf")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        log.setLevel(level)


def nncf_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("nncf") is not None


def nncf_quantize(model: Any, batches: Iterable[np.ndarray], *, ignored_nodes: Sequence[str] = (),
                  subset_size: int | None = None) -> Any:
    """NNCF's INT8 of an FP32 onnx.ModelProto, calibrated on ``batches`` (preprocessed float32 NCHW arrays).

    Every NNCF default is kept (TRANSFORMER model type, its SmoothQuant α, its ranges and overflow fix): the point is
    to be NNCF's scheme, measured as such. ``ignored_nodes``: node names to leave in float."""
    nncf = import_nncf()
    import copy

    name = model.graph.input[0].name
    items = [{name: b[i : i + 1]} for b in batches for i in range(len(b))]
    if not items:
        raise VitdeployError("no calibration images could be read for NNCF")
    ignored = nncf.IgnoredScope(names=list(ignored_nodes), validate=False) if ignored_nodes else None
    from nncf.onnx.quantization.backend_parameters import BackendParameters
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters

    # weights stay float -> Q -> DQ, so the guard can put a layer back in float (quantize.QuantizedGraphSwitch, which
    # folds Q into int8 initializers when it writes the model, as NNCF's own weight compression does)
    adv = AdvancedQuantizationParameters(backend_params={BackendParameters.COMPRESS_WEIGHTS: False})
    with quiet():
        return nncf.quantize(copy.deepcopy(model), nncf.Dataset(items), model_type=nncf.ModelType.TRANSFORMER,
                             subset_size=subset_size or len(items), ignored_scope=ignored, advanced_parameters=adv)


def nncf_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("nncf")
    except Exception:  # not installed
        return None
