"""Settings of ``slimserve triton``: the repository Triton serves alone, where it listens, gRPC TLS.

The flags are derived from the fields (``settings.add_config_flags``); environment variables
``SLIMSERVE_TRITON_<FIELD>``. ``server_config`` turns the settings into the launcher's
``TritonServerConfig``. Light to import: the parser is built from it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from .errors import UserError
from .serving.scoring.config import ScoringServiceConfig
from .serving.triton.launcher import TritonGrpcTls, TritonServerConfig
from .settings import Settings

_TRITON = {field.name: field.default for field in dataclasses.fields(TritonServerConfig)}
_PORT = {"ge": 0, "le": 65535}


class TritonConfig(Settings):
    """What ``slimserve triton`` serves and where: Triton's usual ports, loopback unless told otherwise."""

    env_prefix: ClassVar[str] = "SLIMSERVE_TRITON_"

    model_repository: Path = Field(
        ScoringServiceConfig.model_fields["model_repository"].default,
        description="Triton model repository to serve (`slimserve export` or `build` publishes into it).",
    )
    host: str = Field(_TRITON["host"], description="Address to bind (0.0.0.0 to expose).")
    grpc_port: int = Field(8001, **_PORT, description="Triton gRPC port (0: free).")
    http_port: int = Field(8000, **_PORT, description="Triton HTTP port, readiness and /v2 (0: free).")
    metrics_port: int = Field(8002, **_PORT, description="Triton metrics port (0: free).")
    startup_timeout: float = Field(300.0, gt=0, description="Seconds to wait for readiness.")
    grpc_server_cert: Path | None = Field(
        None, description="gRPC TLS: server certificate (PEM), gRPC then speaks TLS only; unset: plaintext."
    )
    grpc_server_key: Path | None = Field(None, description="gRPC TLS: private key (PEM) of grpc_server_cert.")
    grpc_root_cert: Path | None = Field(None, description="gRPC mTLS: CA (PEM) of client certificates.")

    def grpc_tls(self) -> TritonGrpcTls | None:
        """Triton's gRPC TLS (None: plaintext); the certificate and key go together."""
        if not (self.grpc_server_cert or self.grpc_server_key or self.grpc_root_cert):
            return None
        if not (self.grpc_server_cert and self.grpc_server_key):
            raise UserError(
                "--grpc-server-cert and --grpc-server-key go together (and --grpc-root-cert needs them)"
            )
        return TritonGrpcTls(self.grpc_server_cert, self.grpc_server_key, self.grpc_root_cert)

    def server_config(self) -> TritonServerConfig:
        """The launcher's config: this repository (which must exist), address, ports, timeout and TLS."""
        grpc_tls = self.grpc_tls()
        if not self.model_repository.is_dir():
            raise UserError(
                f"--model-repository {self.model_repository} does not exist; run `slimserve export` first"
            )
        return TritonServerConfig(
            model_repository=self.model_repository.resolve(),
            host=self.host,
            grpc_port=self.grpc_port,
            http_port=self.http_port,
            metrics_port=self.metrics_port,
            startup_timeout_s=self.startup_timeout,
            grpc_tls=grpc_tls,
        )
