"""Model files that run inside Triton (python backend). Self-contained: numpy, onnxruntime, pb_utils."""
