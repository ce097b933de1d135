"""The reasoning service: streamed text generation (Explain, Generate) with the Triton generator model."""
