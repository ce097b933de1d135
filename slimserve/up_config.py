"""Settings of ``slimserve up``: what it builds (or exports) and serves, and where everything listens.

A service setting takes its default and bounds from the service's own config (``ScoringServiceConfig``,
``ReasoningServiceConfig``), a Triton setting from ``TritonServerConfig``, the teacher from
``ScorerExportConfig``: nothing is repeated here. The flags are derived from the fields
(``settings.add_config_flags``); environment variables ``SLIMSERVE_UP_<FIELD>``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator

from .channel import TRITON_TLS_FIELDS, check_triton_tls
from .export.pipeline import ScorerExportConfig
from .serving.reasoning.config import ReasoningServiceConfig
from .serving.scoring.config import ScoringServiceConfig
from .serving.triton.launcher import TritonServerConfig
from .settings import Settings, field_like

DEFAULT_RECIPE = "cpu"
_TRITON = {field.name: field.default for field in dataclasses.fields(TritonServerConfig)}
_PORT = {"ge": 0, "le": 65535}


class UpConfig(Settings):
    """What ``slimserve up`` builds or exports, and where Triton and the services listen."""

    env_prefix: ClassVar[str] = "SLIMSERVE_UP_"

    recipe: str = Field(
        DEFAULT_RECIPE,
        description="The recipe built and served (tiny, cpu, gpu or a YAML file); a rerun serves what it "
        "published, an interrupted build resumes.",
    )
    teacher_only: bool = Field(
        False,
        description="No build: serve what the repository holds, exporting the teacher zero-shot if it "
        "holds nothing.",
    )
    teacher: str = field_like(
        ScorerExportConfig, "teacher", "With teacher_only: export this teacher as the scorer (and generator)."
    )
    generator: bool = Field(
        True,
        description="With teacher_only: also export the teacher as the generator when none is published "
        "(--no-generator: scoring only).",
    )
    work_dir: Path | None = Field(
        None, description="The build's stage outputs (resumable); unset: the recipe's."
    )
    model_repository: Path = field_like(
        ScoringServiceConfig, "model_repository", "Triton model repository the models are published in."
    )
    model_name: str = field_like(
        ScoringServiceConfig, "model_name", "Name of the scoring model in the repository."
    )
    generator_name: str = field_like(
        ReasoningServiceConfig, "model_name", "Name of the generator in the repository (reasoning service)."
    )
    host: str = field_like(ScoringServiceConfig, "host", "Address both gRPC services bind.")
    port: int = field_like(ScoringServiceConfig, "port", "gRPC port of the scoring service (0: free).")
    metrics_port: int = field_like(
        ScoringServiceConfig, "metrics_port", "Prometheus port of the scoring service (0: free, -1: off)."
    )
    reasoning_port: int = field_like(
        ReasoningServiceConfig, "port", "gRPC port of the reasoning service (0: free)."
    )
    reasoning_metrics_port: int = field_like(
        ReasoningServiceConfig, "metrics_port", "Prometheus port of the reasoning service (0: free, -1: off)."
    )
    triton_url: str | None = Field(
        None, description="Use this running Triton (host:port) instead of starting one."
    )
    triton_tls: bool = field_like(
        ScoringServiceConfig,
        "triton_tls",
        "With triton_url: speak TLS to it (a Triton run with --grpc-use-ssl).",
    )
    triton_tls_ca_file: Path | None = field_like(
        ScoringServiceConfig,
        "triton_tls_ca_file",
        "With triton_url: CA certificates (PEM) that signed its certificate (implies TLS).",
    )
    triton_tls_cert_file: Path | None = field_like(
        ScoringServiceConfig,
        "triton_tls_cert_file",
        "With triton_url: client certificate (PEM) for a Triton run with --grpc-use-ssl-mutual.",
    )
    triton_tls_key_file: Path | None = field_like(
        ScoringServiceConfig, "triton_tls_key_file", "Private key (PEM) of triton_tls_cert_file."
    )
    triton_tls_server_name: str | None = field_like(
        ScoringServiceConfig,
        "triton_tls_server_name",
        "Name the Triton's certificate must carry, when not the host of triton_url.",
    )
    grpc_port: int = Field(
        _TRITON["grpc_port"], **_PORT, description="Triton gRPC port when started here (0: free)."
    )
    http_port: int = Field(
        _TRITON["http_port"], **_PORT, description="Triton HTTP port when started here (0: free)."
    )
    triton_metrics_port: int = Field(
        _TRITON["metrics_port"], **_PORT, description="Triton metrics port when started here (0: free)."
    )
    startup_timeout_s: float = Field(
        300.0, gt=0, description="Most seconds Triton, or a service's model, may take to become ready."
    )
    sample: bool = Field(True, description="Answer a sample request on each service (--no-sample: skip).")
    exit_after_sample: bool = Field(False, description="Stop after the sample requests instead of serving.")

    def scoring_config(self, triton_url: str, bundle_dir: Path) -> ScoringServiceConfig:
        """The scoring service's config: this address and ports, on ``bundle_dir`` through ``triton_url``."""
        return ScoringServiceConfig(**self._service(self.port, self.metrics_port, triton_url, bundle_dir))

    def reasoning_config(self, triton_url: str, generator_dir: Path) -> ReasoningServiceConfig:
        """The reasoning service's config: this address, its ports, on the generator's bundle."""
        ports = (self.reasoning_port, self.reasoning_metrics_port)
        return ReasoningServiceConfig(**self._service(*ports, triton_url, generator_dir))

    def _service(self, port: int, metrics_port: int, triton_url: str, bundle_dir: Path) -> dict:
        return {
            "host": self.host,
            "port": port,
            "metrics_port": metrics_port,
            "triton_url": triton_url,
            "bundle_dir": bundle_dir,
            **{name: getattr(self, name) for name in TRITON_TLS_FIELDS},
        }

    @model_validator(mode="after")
    def _tls_needs_a_remote_triton(self) -> UpConfig:
        check_triton_tls(self, started_here="the Triton that up starts listens in plaintext on loopback")
        return self

    def triton_config(self, models: tuple[str, ...], repository: Path | None = None) -> TritonServerConfig:
        """Triton started here on ``repository`` (default: ``model_repository``), loading ``models``."""
        return TritonServerConfig(
            model_repository=(repository or self.model_repository).resolve(),
            grpc_port=self.grpc_port,
            http_port=self.http_port,
            metrics_port=self.triton_metrics_port,
            model_control_mode="explicit",
            load_models=models,
            startup_timeout_s=self.startup_timeout_s,
            avoid_ports=self.service_ports(),
        )

    def service_ports(self) -> tuple[int, ...]:
        """The fixed ports the services started here bind (a free pick for Triton must not take them)."""
        ports = (self.port, self.metrics_port, self.reasoning_port, self.reasoning_metrics_port)
        return tuple(port for port in ports if port > 0)
