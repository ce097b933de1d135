"""Configuration fields every gRPC service shares; each service's own model lives in its folder.

One pydantic model per service, every field described; ``GrpcServiceConfig`` holds what the shared
server parts read (addresses, TLS, tokens, health port, Triton and the TLS to it, bundle location,
deadlines, drain, admission, logging), ``RecordLimitsConfig`` the limits on member and item records.
The services' models: ``serving.scoring.config`` and ``serving.reasoning.config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from ..channel import check_triton_tls
from ..settings import ConfigError, Settings, add_config_flags, config_from_args, load_config

if TYPE_CHECKING:
    from slimserve.channel import ClientSecurity

ServiceConfig = Settings


class GrpcServiceConfig(ServiceConfig):
    """Fields every slimserve gRPC service has; subclasses set ``env_prefix`` and their own defaults."""

    host: str = Field("127.0.0.1", description="Address the gRPC server binds (0.0.0.0 in a container).")
    port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free port.")
    metrics_port: int = Field(
        9090, ge=-1, le=65535, description="Prometheus metrics port; 0 picks a free port, -1 turns it off."
    )
    metrics_host: str = Field("0.0.0.0", description="Address the metrics HTTP server binds.")
    triton_url: str = Field("127.0.0.1:8001", description="Triton gRPC endpoint (host:port).")
    triton_tls: bool = Field(
        False,
        description="Speak TLS to Triton (a Triton run with --grpc-use-ssl), checked against the system's "
        "CA certificates unless triton_tls_ca_file is set (which implies TLS).",
    )
    triton_tls_ca_file: Path | None = Field(
        None, description="CA certificates (PEM) that signed Triton's certificate (its --grpc-server-cert)."
    )
    triton_tls_cert_file: Path | None = Field(
        None,
        description="Client certificate (PEM) for a Triton run with --grpc-use-ssl-mutual (implies TLS); "
        "with triton_tls_key_file. Read when the service starts.",
    )
    triton_tls_key_file: Path | None = Field(None, description="Private key (PEM) of triton_tls_cert_file.")
    triton_tls_server_name: str | None = Field(
        None, description="Name Triton's certificate must carry, when not the host of triton_url."
    )
    model_repository: Path = Field(
        Path("model_repository"), description="Triton model repository holding the serving bundle."
    )
    model_name: str = Field("scorer", description="Name of the model in the repository.")
    model_version: int | None = Field(
        None, ge=1, description="Model version to serve; unset serves the latest in the repository."
    )
    bundle_dir: Path | None = Field(
        None, description="Serving bundle directory; overrides model_repository/model_name/model_version."
    )
    default_timeout_s: float = Field(
        10.0, gt=0, description="Time budget of a request whose caller sends no deadline (seconds)."
    )
    health_poll_interval_s: float = Field(
        1.0, gt=0, description="How often the Triton model's readiness is checked (seconds)."
    )
    drain_grace_s: float = Field(
        20.0, ge=0, description="On SIGTERM, how long in-flight RPCs may run before they are cancelled."
    )
    drain_delay_s: float = Field(
        1.0,
        ge=0,
        description="On SIGTERM, seconds between NOT_SERVING and refusing new RPCs: calls already on the "
        "wire are still taken and served (a gRPC server cancels calls not yet matched to a handler when "
        "it stops), and load balancers see NOT_SERVING first.",
    )
    max_concurrent_rpcs: int | None = Field(
        None, ge=1, description="RPCs beyond this many in flight get RESOURCE_EXHAUSTED; unset = no limit."
    )
    max_receive_message_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Largest request message the server accepts (bytes)."
    )
    retry_pushback_ms: int = Field(
        100, ge=0, description="Retry hint (grpc-retry-pushback-ms) sent with a call refused for admission."
    )
    tls_cert_file: Path | None = Field(
        None,
        description="Server certificate chain (PEM); with tls_key_file the port speaks TLS only. "
        "Both files are re-read when they change (on the next new connection).",
    )
    tls_key_file: Path | None = Field(None, description="Private key (PEM) of tls_cert_file.")
    tls_client_ca_file: Path | None = Field(
        None,
        description="CA certificates (PEM) for client certificates; set, every client must present one "
        "it signed (mTLS). Needs tls_cert_file.",
    )
    health_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="A second port on host serving only grpc.health.v1, in plaintext and without a token, "
        "for probes that speak no TLS (the kubelet's gRPC probe); 0 picks a free port; unset: none.",
    )
    allow_plaintext: bool = Field(
        False,
        description="Serve plaintext on a host that is not loopback (e.g. behind a mesh that does mTLS); "
        "without it such a bind is refused.",
    )
    auth_tokens: list[SecretStr] = Field(
        default_factory=list,
        description="Bearer tokens accepted (several: rotation), comma-separated in the environment; "
        "prefer auth_tokens_file (flags show in ps). Empty with no file: no token needed.",
    )
    auth_tokens_file: Path | None = Field(
        None,
        description="File of accepted bearer tokens, one a line (# comments); re-read when it changes.",
    )
    metrics_require_token: bool = Field(
        False, description="The metrics endpoint also asks for a bearer token (Authorization header)."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("auth_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        return value.replace(",", " ").split() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _tls_files_together(self) -> GrpcServiceConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together: set both or neither")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file (mTLS) needs tls_cert_file and tls_key_file")
        if self.metrics_require_token and not (self.auth_tokens or self.auth_tokens_file):
            raise ValueError("metrics_require_token needs auth_tokens or auth_tokens_file")
        check_triton_tls(self)
        if self.health_port and self.health_port == self.port:
            raise ValueError(f"health_port ({self.health_port}) must differ from port")
        return self

    @property
    def uses_tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def uses_tokens(self) -> bool:
        return bool(self.auth_tokens) or self.auth_tokens_file is not None

    def triton_security(self) -> ClientSecurity:
        """How the service reaches Triton: plaintext, TLS or mTLS (the files are read now)."""
        from slimserve.channel import security_from_files

        return security_from_files(
            tls=self.triton_tls,
            ca=self.triton_tls_ca_file,
            cert=self.triton_tls_cert_file,
            key=self.triton_tls_key_file,
            server_name=self.triton_tls_server_name,
            names=("triton_tls_ca_file", "triton_tls_cert_file", "triton_tls_key_file"),
        )

    def resolved_bundle_dir(self) -> Path:
        """The bundle directory this config points at (``bundle_dir`` or the repository's version)."""
        from slimserve.bundle import bundle_dir_for

        if self.bundle_dir is not None:
            return self.bundle_dir
        return bundle_dir_for(self.model_repository, self.model_name, self.model_version)


class RecordLimitsConfig(GrpcServiceConfig):
    """Limits on the member and item records a request carries (checked by ``serving.validation``)."""

    max_text_chars: int = Field(2000, ge=1, description="Longest text field (characters).")
    max_list_items: int = Field(100, ge=0, description="Most entries in a skills or industries list.")
    max_history: int = Field(
        10, ge=0, description="Most entries in member.history (each adds about 15 prompt tokens)."
    )
    max_id_chars: int = Field(256, ge=1, description="Longest member or item id (characters).")


__all__ = [
    "ConfigError",
    "GrpcServiceConfig",
    "RecordLimitsConfig",
    "ServiceConfig",
    "add_config_flags",
    "config_from_args",
    "load_config",
]
