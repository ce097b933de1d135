"""The live stack the fault cases act on: a scratch repository, a real Triton, scoring services.

The scratch repository holds the newest version of the scorer (files hard-linked from the user's
repository where the filesystem allows, else copied) and its ``config.pbtxt``, so killing Triton or
publishing a version never touches the repository ``slimserve up`` serves. Triton runs as ``up`` runs it
(explicit model control, the scorer loaded) on a fixed gRPC port, so a restarted Triton is where the
service expects it. Each case starts its own service as a child process (``slimserve serve``), whose
memory is read from ``/proc``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ...bundle import bundle_dir_for, load_bundle
from ...errors import UserError
from ...serving.config import ScoringServiceConfig
from ...serving.triton.launcher import TritonServer, TritonServerConfig, free_port
from ..service import ServiceProcess, running_service
from .config import FaultsConfig

log = logging.getLogger(__name__)

CONFIG_FILE = "config.pbtxt"
# The service runs with its production defaults for what the faults exercise (``bench.service`` sets a
# quicker health poll and a short drain grace for its benchmarks).
PRODUCTION_DEFAULTS = ("health_poll_interval_s", "drain_grace_s", "drain_delay_s")


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (``VmRSS`` in ``/proc/<pid>/status``), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def scratch_repository(repository: Path, model_name: str, into: Path) -> Path:
    """``into/<model_name>`` holding the newest version of ``model_name`` and its config; the bundle dir."""
    source_bundle = bundle_dir_for(repository, model_name)
    version_dir = source_bundle.parent
    model_dir = into / model_name
    model_dir.mkdir(parents=True)
    shutil.copy2(version_dir.parent / CONFIG_FILE, model_dir / CONFIG_FILE)
    shutil.copytree(version_dir, model_dir / version_dir.name, copy_function=_link_or_copy)
    return model_dir / version_dir.name / source_bundle.name


def service_default(name: str) -> object:
    """The scoring service's default for a setting."""
    return ScoringServiceConfig.model_fields[name].default


@dataclass
class Stack:
    """Triton on ``grpc_port`` serving the scratch repository, and how to start services against it."""

    repository: Path
    model_name: str
    bundle_dir: Path
    grpc_port: int
    startup_timeout_s: float
    triton: TritonServer | None = None

    @property
    def triton_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def bundle(self):
        return load_bundle(self.bundle_dir)

    def start_triton(self) -> TritonServer:
        """Start Triton (again) on the stack's gRPC port, serving the scorer; wait until it is ready."""
        config = TritonServerConfig(
            model_repository=self.repository,
            grpc_port=self.grpc_port,
            model_control_mode="explicit",
            load_models=(self.model_name,),
            startup_timeout_s=self.startup_timeout_s,
        )
        self.triton = TritonServer(config).start()
        return self.triton

    def signal_triton(self, signum: int) -> None:
        """Send ``signum`` to Triton's whole process group (the server and its python-backend stubs)."""
        assert self.triton is not None and self.triton.pid is not None
        os.killpg(self.triton.pid, signum)

    def stop_triton(self) -> None:
        if self.triton is None:
            return
        if self.triton.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.triton.pid, signal.SIGCONT)  # a frozen Triton cannot stop
        self.triton.stop()

    @contextlib.contextmanager
    def service(self, **settings: object) -> Iterator[ServiceProcess]:
        """A scoring service (child process) on a free loopback port against this stack's Triton."""
        defaults = {name: service_default(name) for name in PRODUCTION_DEFAULTS}
        with running_service(
            "serve", self.bundle_dir, self.triton_url, self.startup_timeout_s, **{**defaults, **settings}
        ) as service:
            yield service


@contextlib.contextmanager
def open_stack(config: FaultsConfig) -> Iterator[Stack]:
    """Scratch repository and Triton for ``config``; everything is stopped and removed afterwards."""
    if not config.model_repository.is_dir():
        raise UserError(f"--model-repository {config.model_repository} does not exist")
    if config.work_dir is not None:
        config.work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="slimserve-faults-", dir=config.work_dir) as tmp:
        repository = Path(tmp) / "model_repository"
        bundle_dir = scratch_repository(config.model_repository, config.model_name, repository)
        stack = Stack(repository, config.model_name, bundle_dir, free_port(), config.startup_timeout_s)
        log.info("scratch repository %s (bundle %s)", repository, bundle_dir)
        try:
            stack.start_triton()
            yield stack
        finally:
            stack.stop_triton()
