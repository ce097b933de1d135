"""Compression: teacher fine-tuning, distillation, structured pruning, quantization."""
