"""Errors a user can act on: the CLI prints the message as one line and exits with ``exit_code``."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3


class VitdeployError(Exception):
    """A problem the user can fix; the message names it and says what to do."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(VitdeployError):
    exit_code = EXIT_USAGE


class PartlyDone(VitdeployError):
    """Part of the job is done and written; the message says what is left and how to finish it."""

    exit_code = EXIT_PARTIAL


class ParityError(VitdeployError):
    """An exported or converted model does not answer like its source within the tolerance."""


# --- refusal families: tests and callers match on these types, not on message fragments ---


class UnreadableArtifact(VitdeployError):
    """A file named as a model that cannot be read as one (truncated, another format, no manifest)."""


class UnknownTarget(UsageError):
    """A --target (TensorRT line, JetPack release or module) that the target table does not know."""


class ImpossibleRequest(UsageError):
    """A combination that cannot work on the named device (DLA on a module without it, FP8 before Thor, ...)."""


class TargetMismatch(VitdeployError):
    """An artifact made for one target, asked to serve another (re-make it for the one at hand)."""


class OpsetTooNew(VitdeployError):
    """An ONNX opset the target's parser cannot read."""


class IncompatibleArtifact(VitdeployError):
    """Artifacts that are not copies of one model (other classes, labels or input), compared or packed together."""


class StaleArtifact(VitdeployError):
    """A derived artifact whose recorded source is not the source beside it (made from an older model)."""


class BudgetMissed(VitdeployError):
    """The INT8 guard could not bring the model within its budget even with every quantized layer in float: nothing
    written (the one-command bundle then ships FP16 as its default and says why)."""


class NonFiniteOutput(VitdeployError):
    """A model that answers NaN or Inf on some inputs: never a pass, whatever its agreement."""


class CudaUnavailable(VitdeployError):
    """TensorRT is installed but cannot start CUDA (no GPU, or a driver older than TensorRT's CUDA)."""


class SourceChanged(VitdeployError):
    """A source file replaced or rewritten while a command read or converted it: nothing is written."""


class BadField(VitdeployError):
    """A file written elsewhere (a foreign config.json, a processor config) that is not JSON, too large or too deep,
    or has a field of the wrong type, range or length: the message names the file, the field, its value and what it
    must be (core/schema.py). Exit 1, as every other refusal of a foreign model's files."""
