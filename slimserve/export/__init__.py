"""Export: the models' scoring graph to ONNX (parity-checked), the generator's ONNX, the Triton model repository.

Sits on ``slimserve.models`` beside ``compression``; the two never import each other.
"""
