"""The ONNX Runtime backend: ``loader`` builds sessions, ``runner`` runs them behind the Runner interface."""

from vitdeploy.runners.onnxruntime.loader import session, session_options
from vitdeploy.runners.onnxruntime.runner import OnnxRuntimeRunner

__all__ = ["OnnxRuntimeRunner", "session", "session_options"]
