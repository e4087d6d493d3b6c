"""TensorRT: the CUDA binding, the version table, the engine builder and the runner (numpy only, never torch)."""
