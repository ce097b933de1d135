"""Start and stop the real Triton server (``tritonserver``) on loopback, for the embedded default and tests.

The binary is ``tritonserver`` on ``PATH`` (a Triton container) or the one inside the ``nvidia-pytriton``
wheel. The wheel's python backend needs a stub matching the running interpreter, so a backend folder is
prepared in a cache directory (:func:`prepare_python_backend`). The server runs in its own session; stopping
it signals the whole process group, so no ``triton_python_backend_stub`` outlives it.

``TritonGrpcTls`` puts the gRPC endpoint under TLS (``--grpc-use-ssl``; with a client CA, mTLS through
``--grpc-use-ssl-mutual``); the HTTP endpoint the readiness wait polls stays plaintext on ``host``.

An external Triton (Kubernetes) is only a URL given to the client: nothing here is used for it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from slimserve.serving.triton.process_group import (
    group_members,
    kill_group,
    remove_shm_regions,
    stub_shm_regions,
    wait_exit_unreaped,
    wait_group_gone,
)
from slimserve.serving.triton.server_files import (
    find_tritonserver,
    is_pytriton_binary,
    prepare_python_backend,
)

__all__ = [
    "TritonGrpcTls",
    "TritonLaunchError",
    "TritonServer",
    "TritonServerConfig",
    "find_tritonserver",
    "group_members",
    "prepare_python_backend",
]

log = logging.getLogger(__name__)

MODEL_CONTROL_MODES = ("none", "explicit", "poll")
LOG_TAIL_LINES = 40
_POLL_INTERVAL_S = 0.1
_PORT_ATTEMPTS = 3
_PORT_TAKEN = "already in use"  # Triton's log line when a port cannot be bound
# Readiness probes go straight to loopback, whatever http_proxy says.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class TritonLaunchError(RuntimeError):
    """Triton could not be found, prepared, started or made ready; the message ends with its log tail."""


@dataclass(frozen=True)
class TritonGrpcTls:
    """TLS on Triton's gRPC endpoint: its certificate and key (PEM); with ``client_ca``, every client
    must present a certificate that CA signed (mTLS). Triton reads the files once, at start."""

    server_cert: Path
    server_key: Path
    client_ca: Path | None = None

    def args(self) -> list[str]:
        """Triton's flags for this setting."""
        args = [
            "--grpc-use-ssl=true",
            f"--grpc-server-cert={self.server_cert}",
            f"--grpc-server-key={self.server_key}",
        ]
        if self.client_ca is not None:
            args += ["--grpc-use-ssl-mutual=true", f"--grpc-root-cert={self.client_ca}"]
        return args

    def missing(self) -> list[Path]:
        """The files that do not exist."""
        return [
            Path(f)
            for f in (self.server_cert, self.server_key, self.client_ca)
            if f and not Path(f).is_file()
        ]


@dataclass
class TritonServerConfig:
    """How to run one local Triton server. Ports 0 mean "pick a free port"."""

    model_repository: Path
    grpc_port: int = 0
    http_port: int = 0
    metrics_port: int = 0
    host: str = "127.0.0.1"
    model_control_mode: str = "none"
    # Models loaded at start (explicit mode) and waited for (any mode).
    load_models: tuple[str, ...] = ()
    startup_timeout_s: float = 120.0
    exit_timeout_s: int = 10
    log_file: Path | None = None
    log_verbose: int = 0
    extra_args: tuple[str, ...] = ()
    # None: plaintext gRPC.
    grpc_tls: TritonGrpcTls | None = None
    # None: find_tritonserver(). A backend directory is prepared only for the pytriton wheel's binary.
    binary: Path | None = None
    backend_directory: Path | None = None
    cache_dir: Path | None = None
    # Seconds between SIGTERM and SIGKILL; None: exit_timeout_s + 5.
    stop_grace_s: float | None = None
    # Ports a free pick (port 0 above) must not take: what other servers started next to it will bind.
    avoid_ports: tuple[int, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.model_repository = Path(self.model_repository)
        if self.model_control_mode not in MODEL_CONTROL_MODES:
            raise ValueError(f"model_control_mode must be one of {MODEL_CONTROL_MODES}")
        self.load_models = tuple(self.load_models)
        self.extra_args = tuple(self.extra_args)
        self.avoid_ports = tuple(self.avoid_ports)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_ports(count: int, host: str = "127.0.0.1", avoid: Collection[int] = ()) -> list[int]:
    """``count`` distinct TCP ports that were free a moment ago, none of them in ``avoid``.

    The sockets are held open together while picking: one after the other, the OS may hand out the
    same port twice (and Triton refuses two endpoints on one port). ``avoid``: ports free now that
    something else binds later (``slimserve up``'s services: 50051 and 50052 are in Linux's range of
    picks).
    """
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
            if sock.getsockname()[1] not in avoid:
                ports.append(sock.getsockname()[1])
        return ports
    finally:
        for sock in sockets:
            sock.close()


def _resolve_ports(requested: dict[str, int], host: str, avoid: Collection[int] = ()) -> dict[str, int]:
    """The requested ports, with every 0 replaced by a free port distinct from all the others and
    outside ``avoid``."""
    picked = iter(free_ports(sum(1 for port in requested.values() if not port), host, avoid))
    return {kind: port or next(picked) for kind, port in requested.items()}


def read_log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' when there is none)."""
    if path is None or not Path(path).is_file():
        return ""
    with open(path, errors="replace") as handle:
        return "".join(deque(handle, maxlen=lines))


# Strong references: a started server is stopped at interpreter exit even if its owner dropped it.
_RUNNING: set[TritonServer] = set()


@atexit.register
def _stop_all_at_exit() -> None:
    for server in list(_RUNNING):
        with contextlib.suppress(Exception):
            server.stop()


class TritonServer:
    """One ``tritonserver`` process: ``start()`` waits until it and the requested models are ready."""

    def __init__(self, config: TritonServerConfig):
        self.config = config
        self._process: subprocess.Popen | None = None
        self._log_path: Path | None = None
        self._ports: dict[str, int] = {}

    # -- addresses ---------------------------------------------------------------------------------
    def _address(self, kind: str) -> str:
        if kind not in self._ports:
            raise RuntimeError("the Triton server has not been started")
        return f"{self.config.host}:{self._ports[kind]}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint (what the client takes)."""
        return self._address("grpc")

    @property
    def http_url(self) -> str:
        return f"http://{self._address('http')}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._address('metrics')}/metrics"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return read_log_tail(self._log_path, lines)

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def command(self) -> list[str]:
        """The command line (after ports and backend directory are resolved by ``start``)."""
        cfg = self.config
        binary = Path(cfg.binary) if cfg.binary else find_tritonserver()
        args = [
            str(binary),
            f"--model-repository={cfg.model_repository}",
            f"--model-control-mode={cfg.model_control_mode}",
            f"--exit-timeout-secs={cfg.exit_timeout_s}",
            f"--log-verbose={cfg.log_verbose}",
            "--pinned-memory-pool-byte-size=0",
            "--allow-gpu-metrics=false",
        ]
        for kind in ("grpc", "http", "metrics"):
            args += [f"--{kind}-address={cfg.host}", f"--{kind}-port={self._ports[kind]}"]
        backend_dir = cfg.backend_directory
        if backend_dir is None and is_pytriton_binary(binary):
            backend_dir = prepare_python_backend(cfg.cache_dir)
        if backend_dir is not None:
            args.append(f"--backend-directory={backend_dir}")
        if cfg.model_control_mode == "explicit":
            args += [f"--load-model={name}" for name in cfg.load_models]
        if cfg.grpc_tls is not None:
            args += cfg.grpc_tls.args()
        return args + list(cfg.extra_args)

    def _environment(self) -> dict[str, str]:
        env = {**os.environ, **self.config.env}
        # The stub's embedded Python ignores PYTHONPATH; it finds the venv's packages (numpy, onnxruntime)
        # only when the venv's bin/ comes first on PATH at server start.
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([venv_bin, *[p for p in env.get("PATH", "").split(os.pathsep) if p]])
        return env

    def start(self) -> TritonServer:
        """Start the server and wait until it is ready; raise ``TritonLaunchError`` with the log tail."""
        if self.is_running():
            return self
        cfg = self.config
        if not cfg.model_repository.is_dir():
            raise TritonLaunchError(f"model repository {cfg.model_repository} is not a directory")
        if cfg.grpc_tls is not None and cfg.grpc_tls.missing():
            missing = ", ".join(map(str, cfg.grpc_tls.missing()))
            raise TritonLaunchError(f"Triton's gRPC TLS files do not exist: {missing}")
        if cfg.log_file is not None:
            self._log_path = Path(cfg.log_file)
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_path.touch()
        else:
            handle, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(handle)
            self._log_path = Path(name)
        requested = {"grpc": cfg.grpc_port, "http": cfg.http_port, "metrics": cfg.metrics_port}
        # A port picked free can be taken before Triton binds it: retry those with new picks.
        attempts = _PORT_ATTEMPTS if 0 in requested.values() else 1
        for attempt in range(1, attempts + 1):
            self._ports = _resolve_ports(requested, cfg.host, set(cfg.avoid_ports))
            log_offset = self._log_path.stat().st_size
            try:
                self._launch()
                self._wait_ready()
            except TritonLaunchError:
                self.stop()
                if attempt < attempts and _PORT_TAKEN in self._log_text_since(log_offset):
                    log.warning("a Triton port was taken meanwhile; retrying with other ports")
                    continue
                raise
            except BaseException:
                self.stop()
                raise
            break
        tls = "plaintext" if cfg.grpc_tls is None else "mTLS" if cfg.grpc_tls.client_ca else "TLS"
        log.info("Triton ready: grpc %s (%s), http %s (pid %d)", self.grpc_url, tls, self.http_url, self.pid)
        return self

    def _launch(self) -> None:
        try:
            args = self.command()
        except OSError as exc:
            raise TritonLaunchError(str(exc)) from exc
        log.info("starting Triton: %s (log: %s)", " ".join(args), self._log_path)
        assert self._log_path is not None
        with open(self._log_path, "ab") as log_handle:
            try:
                self._process = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=log_handle,
                    stderr=subprocess.STDOUT,
                    env=self._environment(),
                    start_new_session=True,  # own process group: stop() signals the stubs too
                )
            except OSError as exc:
                raise TritonLaunchError(f"cannot run {args[0]}: {exc}") from exc
        _RUNNING.add(self)

    def _log_text_since(self, offset: int) -> str:
        assert self._log_path is not None
        with open(self._log_path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")

    @staticmethod
    def _url_ok(url: str) -> bool:
        try:
            with _NO_PROXY.open(url, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _ready_urls(self) -> list[str]:
        """What must answer 200 before ``start`` returns: health, each requested model, and metrics.

        Triton opens its metrics endpoint after the HTTP one, so HTTP ready alone does not mean a
        scrape (or perf_analyzer's metrics collection) would connect yet.
        """
        cfg = self.config
        paths = ["/v2/health/ready"] + [f"/v2/models/{name}/ready" for name in cfg.load_models]
        urls = [f"{self.http_url}{path}" for path in paths]
        if "--allow-metrics=false" not in cfg.extra_args:
            urls.append(self.metrics_url)
        return urls

    def _wait_ready(self) -> None:
        cfg = self.config
        urls = self._ready_urls()
        deadline = time.monotonic() + cfg.startup_timeout_s
        while True:
            assert self._process is not None
            code = self._process.poll()
            if code is not None:
                raise TritonLaunchError(self._failure(f"tritonserver exited with code {code} during start"))
            if all(self._url_ok(url) for url in urls):
                return
            if time.monotonic() > deadline:
                raise TritonLaunchError(
                    self._failure(
                        f"tritonserver not ready after {cfg.startup_timeout_s:g} s (waited for {urls})"
                    )
                )
            time.sleep(_POLL_INTERVAL_S)

    def _failure(self, what: str) -> str:
        tail = self.log_tail().rstrip()
        return f"{what}; log {self._log_path}, last {LOG_TAIL_LINES} lines:\n{tail}"

    def stop(self) -> int | None:
        """SIGTERM, wait ``stop_grace_s``, SIGKILL the group; reap all. Returns the exit code."""
        process = self._process
        if process is None:
            return None
        _RUNNING.discard(self)
        pgid = process.pid  # leader of its own session and group
        grace = self.config.stop_grace_s
        grace = self.config.exit_timeout_s + 5 if grace is None else grace
        shm_regions = stub_shm_regions(pgid)
        if process.returncode is None:
            # Only the server gets SIGTERM: it unloads models, which shuts its stubs down cleanly.
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            if not wait_exit_unreaped(process.pid, grace):
                log.warning("Triton (pid %d) did not exit within %.1f s: SIGKILL", process.pid, grace)
                shm_regions |= stub_shm_regions(pgid)
                kill_group(pgid)
                wait_exit_unreaped(process.pid, 10.0)
            # The server is a zombie now, so its pid (= the group id) cannot be reused yet: kill leftovers.
            kill_group(pgid)
        code = process.wait()
        wait_group_gone(pgid, 5.0)
        # A killed server cannot unlink the shared memory of its stubs; a clean exit already did.
        remove_shm_regions(shm_regions)
        self._process = None
        return code
