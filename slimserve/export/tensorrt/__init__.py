"""The GPU target: Model Optimizer Q/DQ, strongly typed TensorRT engines, their Triton config and parity gate.

Modules that need TensorRT, CUDA or Model Optimizer import them inside their functions, so everything
else (profiles, configs, gates, recipe checks) runs and is tested on machines without a GPU.
"""
