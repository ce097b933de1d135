"""Serving: the Triton launcher and client, and the gRPC services (no torch, no build code)."""
