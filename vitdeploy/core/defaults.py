"""Defaults the library uses and the CLI's ``--help`` shows, in a module that imports nothing.

``vitdeploy --help`` (and every refusal of a bad option value) registers all commands, and Typer reads an
option's default when it registers it: a default kept beside the numpy/onnx code that uses it would import
that code into every ``vitdeploy`` process. Here each default has one home; checks.numerics and
stages.precision read it from here.
"""

from __future__ import annotations

# numerics (checks/numerics.py): headroom under this is flagged: a tensor within 2× of 65504 on these images can
# overflow on the next one.
SAFETY = 2.0
# Spread over this is flagged: per-tensor INT8 gives the median channel 127/spread levels; at 16 that is
# under 8 levels (3 bits), where RepQ-ViT/FQ-ViT see post-LayerNorm quantization collapse.
SPREAD_LIMIT = 16.0

# calibrate (stages/precision.py): defaults chosen by measurement on the digits model (see README "calibrate").
DEFAULT_METHOD = "entropy"
DEFAULT_QUANTIZE_ATTENTION = False
