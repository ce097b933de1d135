"""slimserve: compress a recommendation LLM into small students and serve them through Triton."""

__version__ = "0.1.0"
