"""Export: wrap a causal LM into the scoring graph, export ONNX, write the Triton model repository."""
