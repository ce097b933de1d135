"""Generated protobuf and gRPC stubs of the public API (``protos/slimserve/v1``); do not edit."""
