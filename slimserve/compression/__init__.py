"""Compression: teacher fine-tuning, distillation, structured pruning, quantization (INT8, SmoothQuant).

Sits on ``slimserve.models`` beside ``export``; the two never import each other.
"""
