"""Triton boundary: the server launcher and the one client module that imports tritonclient."""
