"""TensorRT runner: numpy, tensorrt and libcudart through ctypes — no torch, no pycuda build.

The sidecar is checked against this TensorRT and this GPU before the plan is deserialized, so an
engine from another device is a clear "rebuild it here" error, never a segfault. Buffers (device and
page-locked host) are allocated once per batch shape and reused; everything runs on the runner's own
stream through ``set_input_shape`` / ``set_tensor_address`` / ``execute_async_v3`` (TensorRT 8.5 … 11).

An engine may have several outputs (an embedding model exported with ``--tokens``: ``embedding`` and
``patch_tokens``). ``run`` returns the main one (the task's output, by name), as every runner does;
``run_outputs`` returns every output by name, and ``run_with_tokens`` (verify's per-patch map) reads the patch tokens
from it. Every output gets device and pinned host memory; only what is asked for is copied back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.core.artifact import read_manifest
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.task import TOKENS_OUTPUT, task_of
from vitdeploy.runners.base import Runner
from vitdeploy.runners.tensorrt.versions import read_record, record_profile, require_compatible


@dataclass
class _Buffers:
    """Device and pinned host memory for one batch shape."""

    n: int
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    d_in: int
    d_out: int
    h_in: int
    h_out: int
    host_in: np.ndarray
    host_out: np.ndarray
    # the outputs other than the main one, by name: (device pointer, pinned host pointer, host view)
    extra: dict[str, tuple[int, int, np.ndarray]] = field(default_factory=dict)


def padded_batch(n: int, min_batch: int, max_batch: int) -> int:
    """The batch the engine runs for ``n`` images: at least the profile's min (DLA: the fixed batch)."""
    if n > max_batch:
        raise ValueError(f"batch {n} above the engine's max {max_batch}")
    return max(n, min_batch)


class TensorRTRunner(Runner):
    backend = "tensorrt"

    def __init__(self, path: str | Path, device: int = 0) -> None:
        from vitdeploy.runners.tensorrt.cuda import CudaRuntime
        from vitdeploy.runners.tensorrt.versions import import_tensorrt

        path = Path(path)
        manifest = read_manifest(path)  # the sidecar; a clear error when it is missing
        super().__init__(manifest, path)
        rec = read_record(manifest, path)
        self.record = rec
        self.profile = record_profile(rec)
        self.sample_dims = tuple(int(d) for d in rec["profile"]["opt"][1:])
        trt = import_tensorrt()
        if isinstance(trt, str):
            raise VitdeployError(f"{path}: {trt}; run the .onnx beside it with ONNX Runtime, or install TensorRT")
        self.cuda = CudaRuntime()
        if self.cuda.device_count() <= device:
            why = getattr(self.cuda, "last_error", "")
            raise VitdeployError(f"{path}: no CUDA GPU {device} here{f' ({why})' if why else ''}; "
                                 "an engine runs only on an NVIDIA GPU")
        self.cuda.set_device(device)
        self.device = device
        require_compatible(path, rec, str(trt.__version__), self.cuda.compute_capability(device))
        self._load(path, rec)

    def _load(self, path: Path, rec: dict[str, Any]) -> None:
        import tensorrt as trt

        from vitdeploy.runners.tensorrt.errors import no_context, trt_call

        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt_call(trt.Runtime, self._logger, what="trt.Runtime")  # CUDA that cannot start: one line
        if rec.get("version_compatible"):
            self._runtime.engine_host_code_allowed = True  # version-compatible plans carry their lean runtime
        dla_core = (rec.get("options") or {}).get("dla_core")
        if dla_core is not None:  # a DLA engine loads on the core it was built for (trtexec sets it the same way)
            self._runtime.DLA_core = int(dla_core)
        engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if engine is None:
            raise VitdeployError(
                f"{path}: TensorRT {trt.__version__} could not load it although its sidecar matches this device; "
                f"rebuild it here with `vitdeploy build-engine {rec.get('source_onnx', '<model>.onnx')}`"
            )
        self.engine = engine
        self.context = engine.create_execution_context()
        if self.context is None:
            raise no_context(path)
        inputs: list[str] = []
        outputs: list[str] = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            (inputs if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outputs).append(name)
        if len(inputs) != 1 or not outputs:
            raise VitdeployError(f"{path}: expected one input and logits out, found inputs {inputs}, outputs {outputs}")
        # the main output is the task's (embedding, logits) by name, not the first the plan lists: an engine built
        # with --tokens has patch_tokens beside it, and the order of a plan's outputs is TensorRT's to choose
        main = task_of(self.manifest).output
        self.input_name, self.output_name = inputs[0], main if main in outputs else outputs[0]
        self.output_names = [self.output_name] + [o for o in outputs if o != self.output_name]
        self.extra_outputs = self.output_names[1:]
        self.input_dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(self.input_name)))
        self.output_dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(self.output_name)))
        self.stream = self.cuda.stream_create()
        self._buffers: dict[int, _Buffers] = {}

    @property
    def max_batch(self) -> int | None:
        return self.profile.max

    def _buffers_for(self, n: int) -> _Buffers:
        """Allocate once per batch shape: set the input shape, ask TensorRT for the output shape."""
        from vitdeploy.runners.tensorrt.cuda import host_array

        b = self._buffers.get(n)
        if b is not None:
            return b
        in_shape = (n, *self.sample_dims)
        if not self.context.set_input_shape(self.input_name, in_shape):
            raise VitdeployError(f"{self.artifact}: TensorRT refused input shape {in_shape} (profile {self.profile})")
        dims = self.context.get_tensor_shape(self.output_name)
        out_shape = tuple(int(dims[i]) for i in range(len(dims)))
        nin = int(np.prod(in_shape)) * self.input_dtype.itemsize
        nout = int(np.prod(out_shape)) * self.output_dtype.itemsize
        cu = self.cuda
        d_in, d_out, h_in, h_out = cu.malloc(nin), cu.malloc(nout), cu.malloc_host(nin), cu.malloc_host(nout)
        b = _Buffers(n, in_shape, out_shape, d_in, d_out, h_in, h_out,
                     host_array(h_in, in_shape, self.input_dtype), host_array(h_out, out_shape, self.output_dtype))
        self._buffers[n] = b  # before the extras: close() frees whatever was allocated if one of them fails
        for name in self.extra_outputs:  # every other output (patch_tokens): device memory and a host copy
            d = self.context.get_tensor_shape(name)
            shape = tuple(int(d[i]) for i in range(len(d)))
            dt = np.dtype(_nptype(self.engine.get_tensor_dtype(name)))
            nbytes = int(np.prod(shape)) * dt.itemsize
            dev = cu.malloc(nbytes)
            host = cu.malloc_host(nbytes)
            b.extra[name] = (dev, host, host_array(host, shape, dt))
        return b

    def run(self, batch: np.ndarray) -> np.ndarray:
        """The main output (the task's: logits or embedding) of a batch, as every runner's ``run``."""
        x = self.check_input(batch)
        if len(x) == 0:
            return np.zeros((0, self.manifest.num_classes), np.float32)
        return self._execute(x, ())[self.output_name]

    def run_outputs(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """Every output of the engine by name, the main one first (float32 copies, ``max_batch`` split as
        ``__call__`` does): an engine built from an export with --tokens answers ``patch_tokens`` here too."""
        x = self.check_input(batch)
        mb = self.max_batch or max(len(x), 1)
        parts = [self._execute(x[i : i + mb], self.extra_outputs) for i in range(0, len(x), mb)]
        if not parts:
            return {self.output_name: np.zeros((0, self.manifest.num_classes), np.float32)}
        return {name: np.concatenate([p[name] for p in parts]) for name in self.output_names}

    def run_with_tokens(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if TOKENS_OUTPUT not in self.extra_outputs:
            return super().run_with_tokens(batch)
        outs = self.run_outputs(batch)
        return outs[self.output_name], outs[TOKENS_OUTPUT]

    def _execute(self, x: np.ndarray, extras: tuple[str, ...] | list[str]) -> dict[str, np.ndarray]:
        """One call of at most ``max_batch`` images: the main output and the ``extras`` asked for, by name."""
        n = len(x)
        m = padded_batch(n, self.profile.min, self.profile.max)
        b = self._buffers_for(m)
        b.host_in[:n] = x  # casts to the engine's input type (float16 for an FP16-input engine)
        if m > n:
            b.host_in[n:] = 0
        ctx, cu = self.context, self.cuda
        if not ctx.set_input_shape(self.input_name, b.in_shape):
            raise VitdeployError(f"{self.artifact}: TensorRT refused input shape {b.in_shape} (profile {self.profile})")
        ctx.set_tensor_address(self.input_name, b.d_in)
        ctx.set_tensor_address(self.output_name, b.d_out)
        for name, (dev, _, _) in b.extra.items():
            ctx.set_tensor_address(name, dev)
        from vitdeploy.runners.tensorrt.cuda import D2H, H2D

        cu.memcpy_async(b.d_in, b.h_in, b.host_in.nbytes, H2D, self.stream)
        if not ctx.execute_async_v3(self.stream):
            raise VitdeployError(f"{self.artifact}: TensorRT could not run a batch of {m} (see its messages above)")
        cu.memcpy_async(b.h_out, b.d_out, b.host_out.nbytes, D2H, self.stream)
        for name in extras:
            dev, host, view = b.extra[name]
            cu.memcpy_async(host, dev, view.nbytes, D2H, self.stream)
        cu.stream_synchronize(self.stream)
        # copies: the pinned buffers are reused
        out = {self.output_name: np.array(b.host_out[:n], dtype=np.float32)}
        out.update({name: np.array(b.extra[name][2][:n], dtype=np.float32) for name in extras})
        return out

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update({"tensorrt": self.record.get("tensorrt"), "gpu": self.record.get("gpu"),
                  "profile": self.profile.to_dict()})
        return d

    def close(self) -> None:
        cu = getattr(self, "cuda", None)
        if cu is None:
            return
        for b in getattr(self, "_buffers", {}).values():
            cu.free(b.d_in)
            cu.free(b.d_out)
            cu.free_host(b.h_in)
            cu.free_host(b.h_out)
            for dev, host, _ in b.extra.values():
                cu.free(dev)
                cu.free_host(host)
        self._buffers = {}
        if getattr(self, "stream", 0):
            cu.stream_destroy(self.stream)
            self.stream = 0
        self.__dict__.pop("context", None)  # TensorRT objects go before the runtime that made them
        self.__dict__.pop("engine", None)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver frees what is left
            pass


def _nptype(dtype: Any) -> Any:
    import tensorrt as trt

    return trt.nptype(dtype)
