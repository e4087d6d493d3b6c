"""vitdeploy: a Vision Transformer from training to a verified TensorRT engine or ONNX Runtime model."""

__version__ = "0.1.0"
