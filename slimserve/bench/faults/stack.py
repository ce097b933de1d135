"""The live stack the fault cases act on: a scratch repository, a real Triton, scoring services.

The scratch repository holds the newest version of the scorer (files hard-linked from the user's
repository where the filesystem allows, else copied) and its ``config.pbtxt``, so killing Triton or
publishing a version never touches the repository ``slimserve up`` serves. Triton runs as ``up`` runs it
(explicit model control, the scorer loaded) on ports picked free once (never the well-known ports a
``slimserve up`` on this host may use), so a restarted Triton is where the service expects it. Each case starts its own service as a child process (``slimserve serve``), whose
memory is read from ``/proc``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ...bundle import bundle_dir_for, load_bundle
from ...errors import UserError
from ...serving.scoring.config import ScoringServiceConfig
from ...serving.triton.launcher import TritonServer, TritonServerConfig
from ..service import ServiceProcess, free_bench_ports, running_service
from .config import FaultsConfig

log = logging.getLogger(__name__)

CONFIG_FILE = "config.pbtxt"
# The service runs with its production defaults for what the faults exercise (``bench.service`` sets a
# quicker health poll and a short drain grace for its benchmarks).
PRODUCTION_DEFAULTS = ("health_poll_interval_s", "drain_grace_s", "drain_delay_s")
STOPPED_STATES = ("T", "t")
STATE_TIMEOUT_S = 10.0


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (``VmRSS`` in ``/proc/<pid>/status``), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def process_state(pid: int) -> str:
    """The state letter of process ``pid`` in ``/proc/<pid>/stat`` (``T`` stopped), "" once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rfind(")") + 2 :].split(maxsplit=1)[0]


def _wait_state(pid: int, stopped: bool, timeout_s: float = STATE_TIMEOUT_S) -> None:
    """Wait until process ``pid`` is stopped (``T``) or, with ``stopped`` False, no longer stopped."""
    deadline = time.monotonic() + timeout_s
    while (process_state(pid) in STOPPED_STATES) != stopped:
        if time.monotonic() > deadline or not process_state(pid):
            raise RuntimeError(f"Triton (pid {pid}) did not {'stop' if stopped else 'resume'}")
        time.sleep(0.001)


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
    http_port: int = 0
    metrics_port: int = 0
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
            http_port=self.http_port,
            metrics_port=self.metrics_port,
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

    def freeze_triton(self) -> None:
        """SIGSTOP to the server process (not its python-backend stubs); return once it is stopped.

        Its sockets stay open and nothing answers, as with a server whose backends run in-process. A
        stopped group is not: the python backend's stubs and server share timed locks in shared memory,
        and after SIGCONT to the group the server died of SIGSEGV (``boost::interprocess::lock_exception``).
        """
        assert self.triton is not None and self.triton.pid is not None
        os.kill(self.triton.pid, signal.SIGSTOP)
        _wait_state(self.triton.pid, stopped=True)

    def resume_triton(self) -> None:
        """SIGCONT to the server process; return once it runs again."""
        assert self.triton is not None and self.triton.pid is not None
        os.kill(self.triton.pid, signal.SIGCONT)
        _wait_state(self.triton.pid, stopped=False)

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
        grpc_port, http_port, metrics_port = free_bench_ports(3)
        stack = Stack(
            repository,
            config.model_name,
            bundle_dir,
            grpc_port,
            config.startup_timeout_s,
            http_port,
            metrics_port,
        )
        log.info("scratch repository %s (bundle %s)", repository, bundle_dir)
        try:
            stack.start_triton()
            yield stack
        finally:
            stack.stop_triton()
