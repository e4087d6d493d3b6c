"""The ``scale`` extra's libraries, imported where used, each missing one named in one line."""

from __future__ import annotations

import importlib
from typing import Any

from vitdeploy.core.errors import VitdeployError

_PIP = {"pyarrow": "pyarrow", "ray": "'ray[data]>=2.58'", "faiss": "faiss-cpu"}


def need(module: str) -> Any:
    """``import module`` or one line saying how to install it (pip install 'vitdeploy[scale]')."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise VitdeployError(f"{top} is not installed: pip install 'vitdeploy[scale]' (or pip install "
                             f"{_PIP.get(top, top)})") from None
