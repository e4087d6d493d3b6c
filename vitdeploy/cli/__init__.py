"""vitdeploy's command line: a thin layer over the library (one module per group of commands)."""

from vitdeploy.cli import bench as _bench  # noqa: F401
from vitdeploy.cli import bundle as _bundle  # noqa: F401
from vitdeploy.cli import conformance as _conformance  # noqa: F401
from vitdeploy.cli import doctor as _doctor  # noqa: F401
from vitdeploy.cli import engine as _engine  # noqa: F401
from vitdeploy.cli import explain as _explain  # noqa: F401
from vitdeploy.cli import export as _export  # noqa: F401
from vitdeploy.cli import importers as _importers  # noqa: F401
from vitdeploy.cli import index as _index  # noqa: F401
from vitdeploy.cli import infer as _infer  # noqa: F401
from vitdeploy.cli import info as _info  # noqa: F401
from vitdeploy.cli import numerics as _numerics  # noqa: F401
from vitdeploy.cli import precision as _precision  # noqa: F401
from vitdeploy.cli import train as _train  # noqa: F401  (registers commands)
from vitdeploy.cli import verify as _verify  # noqa: F401
from vitdeploy.cli.app import app

__all__ = ["app"]
