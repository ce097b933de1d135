"""``perf_analyzer`` (Triton's own load tool) against our Triton: binary, libraries, input data, runs, CSV.

The binary comes from the ``tritonclient==2.51.0`` wheel (it matches the 2.51 server): pip installs it into
the environment's ``bin/``; otherwise it is unzipped from a ``pip download`` of that wheel into
``<cache>/perf_analyzer/2.51.0/``. It links ``libb64.so.0d`` and ``libcudart.so.12``, which the
``nvidia-pytriton`` wheel carries under hashed names; symlinks with the expected names in
``<cache>/perf_analyzer/lib/`` on ``LD_LIBRARY_PATH`` make them resolvable (see RUNTIME-FACTS.md).
``python -m slimserve.bench.perf_analyzer wrap`` (run by ``scripts/install.sh``) does the same for the
environment's own ``bin/perf_analyzer``, so that one also runs by hand (``wrap_venv_binary``).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..cache import cache_dir
from ..tokenization import pad_batch

log = logging.getLogger(__name__)

PERF_ANALYZER_VERSION = "2.51.0"
WHEEL_MEMBER = f"tritonclient-{PERF_ANALYZER_VERSION}.data/data/bin/perf_analyzer"
# soname the binary asks for -> file name pattern in nvidia_pytriton.libs/
LIBRARIES = {"libb64.so.0d": "libb64-*.so.0d", "libcudart.so.12": "libcudart-*.so.12*"}


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer could not be obtained, started, or it failed (the message carries its output)."""


class UnstableMeasurement(PerfAnalyzerError):
    """perf_analyzer's windows never agreed within its stability percentage (it exits 2, no CSV)."""


_UNSTABLE = "Failed to obtain stable measurement"


# -- the binary and its libraries ----------------------------------------------------------------------
def find_perf_analyzer(download: bool = True) -> Path:
    """The ``perf_analyzer`` of this environment's ``bin/``, else the cached one, else download it."""
    beside = Path(sys.executable).parent / "perf_analyzer"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    cached = cache_dir("perf_analyzer", PERF_ANALYZER_VERSION) / "perf_analyzer"
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    if not download:
        raise PerfAnalyzerError(f"no perf_analyzer in {beside.parent} or {cached.parent}")
    return _download(cached)


def _download(target: Path) -> Path:
    """``pip download --no-deps tritonclient==2.51.0`` and unzip the binary to ``target`` (atomic)."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp]
        command.append(f"tritonclient=={PERF_ANALYZER_VERSION}")
        log.info("downloading perf_analyzer: %s", " ".join(command))
        done = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("tritonclient-*.whl"))
        if done.returncode != 0 or not wheels:
            raise PerfAnalyzerError(f"pip download of tritonclient failed: {done.stderr.strip()[-2000:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            try:
                data = wheel.read(WHEEL_MEMBER)
            except KeyError:
                raise PerfAnalyzerError(f"{wheels[0].name} holds no {WHEEL_MEMBER}") from None
        staged = target.with_name(f".perf_analyzer-{os.getpid()}")
        staged.write_bytes(data)
        staged.chmod(0o755)
        os.replace(staged, target)
    return target


def _pytriton_libs() -> Path:
    from ..serving.triton.server_files import pytriton_dir

    root = pytriton_dir()
    libs = root.parent / "nvidia_pytriton.libs" if root is not None else None
    if libs is None or not libs.is_dir():
        raise PerfAnalyzerError("nvidia-pytriton is not installed: perf_analyzer's libraries are missing")
    return libs


def library_dir(folder: Path | None = None) -> Path:
    """``folder`` (default: a cache folder) with ``libb64.so.0d`` and ``libcudart.so.12`` symlinked from
    nvidia-pytriton."""
    libs = _pytriton_libs()
    if folder is None:
        folder = cache_dir("perf_analyzer", "lib")
    folder.mkdir(parents=True, exist_ok=True)
    for soname, pattern in LIBRARIES.items():
        found = sorted(libs.glob(pattern))
        if not found:
            raise PerfAnalyzerError(f"{libs} has no {pattern} (needed as {soname})")
        link = folder / soname
        if link.is_symlink() and link.resolve() == found[0].resolve():
            continue
        staged = folder / f".{soname}-{os.getpid()}"
        staged.unlink(missing_ok=True)
        staged.symlink_to(found[0])
        os.replace(staged, link)
    return folder


def perf_analyzer_env() -> dict[str, str]:
    """The environment perf_analyzer runs with (its library folder first on ``LD_LIBRARY_PATH``)."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(library_dir()), env.get("LD_LIBRARY_PATH")) if p)
    return env


# -- the venv's perf_analyzer, runnable by hand ------------------------------------------------------------
WRAPPER_MARK = "# slimserve: perf_analyzer wrapper"


def wrap_venv_binary(bin_dir: Path | None = None) -> Path:
    """Make ``<bin_dir>/perf_analyzer`` (default: this interpreter's ``bin/``) run as it is, by hand.

    pip puts tritonclient's binary there, and alone it cannot find its libraries. The binary moves to
    ``<bin_dir>/../lib/perf_analyzer-<version>/``, beside symlinks to its libraries (``library_dir``), and
    a small shell script that sets ``LD_LIBRARY_PATH`` and execs it takes its place. Idempotent: run again
    (``scripts/install.sh`` does, on every install), it re-links the libraries and keeps the script; a
    binary that a reinstall of tritonclient put back is moved again. Returns the script's path.
    """
    bin_dir = (bin_dir or Path(sys.executable).parent).absolute()
    entry = bin_dir / "perf_analyzer"
    home = bin_dir.parent / "lib" / f"perf_analyzer-{PERF_ANALYZER_VERSION}"
    real = home / "perf_analyzer"
    head = b""
    if entry.is_file():
        with entry.open("rb") as file:
            head = file.read(4096)
    if head.startswith(b"\x7fELF"):
        home.mkdir(parents=True, exist_ok=True)
        os.replace(entry, real)
    elif head and WRAPPER_MARK.encode() not in head:
        raise PerfAnalyzerError(f"{entry} is neither perf_analyzer nor slimserve's wrapper: left alone")
    if not (real.is_file() and os.access(real, os.X_OK)):
        raise PerfAnalyzerError(f"no perf_analyzer binary at {entry} or {real} (is tritonclient installed?)")
    libs = library_dir(home)
    script = "\n".join(
        [
            "#!/bin/sh",
            WRAPPER_MARK,
            f"# tritonclient {PERF_ANALYZER_VERSION}'s binary with its libraries (libb64, libcudart from",
            "# nvidia-pytriton); written by `python -m slimserve.bench.perf_analyzer wrap` (scripts/install.sh).",
            f'LD_LIBRARY_PATH={shlex.quote(str(libs))}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"',
            "export LD_LIBRARY_PATH",
            f'exec {shlex.quote(str(real))} "$@"',
            "",
        ]
    )
    if not entry.is_file() or entry.read_text() != script:
        staged = entry.with_name(f".perf_analyzer-{os.getpid()}")
        staged.write_text(script)
        staged.chmod(0o755)
        os.replace(staged, entry)
    return entry


def main(argv: list[str] | None = None) -> int:
    """``python -m slimserve.bench.perf_analyzer wrap [--bin-dir DIR]`` (scripts/install.sh runs it)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m slimserve.bench.perf_analyzer")
    sub = parser.add_subparsers(dest="command", required=True)
    wrap = sub.add_parser("wrap", help="make <bin-dir>/perf_analyzer runnable by hand (its libraries found)")
    wrap.add_argument("--bin-dir", type=Path, help="default: the bin/ folder of this Python")
    args = parser.parse_args(argv)
    try:
        entry = wrap_venv_binary(args.bin_dir)
    except PerfAnalyzerError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    sys.stdout.write(f"{entry}: perf_analyzer with its libraries\n")
    return 0


# -- input data ----------------------------------------------------------------------------------------
def input_data_json(
    sequences: list[list[int]], length: int, names: Iterable[str], pad_token_id: int = 0
) -> dict:
    """perf_analyzer ``--input-data`` content: one entry per sequence, padded to ``length``.

    ``names`` are the model's inputs among ``input_ids`` and ``attention_mask`` (shape excludes the batch).
    """
    names = tuple(names)
    ids, mask = pad_batch(sequences, length, pad_token_id)
    tensors = {"input_ids": ids, "attention_mask": mask}
    unknown = sorted(set(names) - set(tensors))
    if unknown:
        raise ValueError(f"input data: cannot make real data for inputs {unknown}")
    return {
        "data": [
            {name: {"content": tensors[name][row].tolist(), "shape": [length]} for name in names}
            for row in range(len(sequences))
        ]
    }


def write_input_data(path: Path, sequences: list[list[int]], length: int, names: Iterable[str]) -> Path:
    return write_json(path, input_data_json(sequences, length, names))


MULTI_ITEM_INPUTS = ("prefix_ids", "prefix_mask", "item_ids", "item_mask")


def multi_item_input_data_json(requests: list, names: Iterable[str] = MULTI_ITEM_INPUTS) -> dict:
    """perf_analyzer ``--input-data`` content for the multi-item scorer: one entry per request exactly as
    the service sends it (``MultiItemRequest``: the prefix once, the items padded to their bucket), each
    with its own shapes (without the batch dimension), so requests of different lengths mix."""
    names = tuple(names)
    unknown = sorted(set(names) - set(MULTI_ITEM_INPUTS))
    if unknown:
        raise ValueError(f"input data: cannot make real data for inputs {unknown}")
    entries = []
    for request in requests:
        arrays = dict(zip(MULTI_ITEM_INPUTS, request.arrays(), strict=True))
        entries.append(
            {
                name: {"content": arrays[name][0].ravel().tolist(), "shape": list(arrays[name].shape[1:])}
                for name in names
            }
        )
    return {"data": entries}


def write_json(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


# -- running and parsing ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class PerfSettings:
    """How perf_analyzer measures each load point: ``max_trials`` windows of at least ``window_requests``.

    perf_analyzer repeats windows until the last three agree within ``stability_percentage`` and exits 2
    (no CSV) when they never do. On a shared, noisy machine that is most of the time, so the default
    accepts any spread (1000 %): the figures are those of the last windows, and they are as noisy as the
    machine. Lower it on a quiet machine. (``--request-count`` is not used: it counts warm-up and
    connection set-up into its throughput, under-reporting it by about 3x in our runs.)
    """

    window_requests: int = 100
    max_trials: int = 3
    stability_percentage: float = 1000.0
    batch_size: int = 1
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        # Stability compares the last three windows: with fewer trials perf_analyzer always fails.
        if self.max_trials < 3:
            raise ValueError(
                f"max_trials must be >= 3 (perf_analyzer compares 3 windows), got {self.max_trials}"
            )
        if self.window_requests < 1 or self.batch_size < 1:
            raise ValueError("window_requests and batch_size must be >= 1")


@dataclass(frozen=True)
class PerfTls:
    """perf_analyzer's TLS to a Triton run with ``--grpc-use-ssl``: the CA that signed its certificate
    (unset: the system's), and a client certificate and key for ``--grpc-use-ssl-mutual``."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def args(self) -> list[str]:
        # 2.51's --ssl-grpc-use-ssl is a bare flag ("doesn't allow an argument"), whatever --help says
        files = (
            ("root-certifications", self.ca_file),
            ("certificate-chain", self.cert_file),
            ("private-key", self.key_file),
        )
        return ["--ssl-grpc-use-ssl"] + [f"--ssl-grpc-{flag}-file={path}" for flag, path in files if path]


@dataclass(frozen=True)
class PerfPoint:
    """One perf_analyzer load point, typed from its CSV row (latencies converted to ms)."""

    model: str
    bucket: int
    mode: str  # "concurrency" or "request_rate"
    load: float
    batch_size: int
    infer_per_s: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    avg_ms: float
    server_queue_ms: float
    server_compute_ms: float
    extra: dict = field(default_factory=dict)
    items_per_inference: float = 1.0  # candidates per request (multi-item: the request's items)

    @property
    def items_per_s(self) -> float:
        return self.infer_per_s * self.batch_size * self.items_per_inference

    def as_dict(self) -> dict:
        data = asdict(self)
        data.pop("extra")
        data["items_per_s"] = self.items_per_s
        return data


_LOAD_COLUMNS = {"Concurrency": "concurrency", "Request Rate": "request_rate"}


def _number(row: dict, column: str) -> float:
    value = row.get(column)
    if value in (None, ""):
        return float("nan")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"perf_analyzer CSV: column {column!r} holds {value!r}, not a number") from None


def parse_perf_csv(
    text: str, model: str, bucket: int, batch_size: int = 1, items_per_inference: float = 1.0
) -> list[PerfPoint]:
    """Typed points from perf_analyzer's ``-f`` CSV (latency columns are microseconds).

    Only the first table is read (``--collect-metrics`` appends server metrics after a blank line).
    """
    table = text.split("\n\n", 1)[0].strip()
    if not table:
        raise ValueError("perf_analyzer CSV is empty")
    reader = csv.DictReader(io.StringIO(table))
    header = reader.fieldnames or []
    load_column = next((c for c in header if c in _LOAD_COLUMNS), None)
    if load_column is None or "Inferences/Second" not in header:
        raise ValueError(f"perf_analyzer CSV: unexpected header {header}")
    points = []
    for row in reader:
        us = {key: _number(row, f"{key} latency") / 1000 for key in ("p50", "p90", "p95", "p99", "Avg")}
        compute = sum(
            _number(row, column)
            for column in ("Server Compute Input", "Server Compute Infer", "Server Compute Output")
        )
        known = {load_column, "Inferences/Second", "Server Queue", *(f"{k} latency" for k in us)}
        points.append(
            PerfPoint(
                model=model,
                bucket=bucket,
                mode=_LOAD_COLUMNS[load_column],
                load=_number(row, load_column),
                batch_size=batch_size,
                infer_per_s=_number(row, "Inferences/Second"),
                p50_ms=us["p50"],
                p90_ms=us["p90"],
                p95_ms=us["p95"],
                p99_ms=us["p99"],
                avg_ms=us["Avg"],
                server_queue_ms=_number(row, "Server Queue") / 1000,
                server_compute_ms=compute / 1000,
                extra={k: v for k, v in row.items() if k not in known},
                items_per_inference=items_per_inference,
            )
        )
    return points


def perf_command(
    binary: Path,
    model: str,
    url: str,
    input_data: Path,
    csv_path: Path,
    mode: str,
    load: float,
    settings: PerfSettings,
    streaming: bool = False,
    tls: PerfTls | None = None,
) -> list[str]:
    """The perf_analyzer command line for one load point (gRPC, async for request rates; TLS with
    ``tls``)."""
    if mode == "concurrency":
        load_args = [f"--concurrency-range={int(load)}:{int(load)}:1"]
    elif mode == "request_rate":
        load_args = [f"--request-rate-range={load:g}:{load:g}:1", "--request-distribution=poisson"]
    else:
        raise ValueError(f"mode must be 'concurrency' or 'request_rate', got {mode!r}")
    command = [
        str(binary),
        "-m",
        model,
        "-u",
        url,
        "-i",
        "grpc",
        "-b",
        str(settings.batch_size),
        f"--input-data={input_data}",
        *_measurement_args(settings),
        "-f",
        str(csv_path),
        *load_args,
        *(tls.args() if tls is not None else []),
    ]
    return [*command, "--streaming"] if streaming else command


def _measurement_args(settings: PerfSettings) -> list[str]:
    return [
        "--measurement-mode=count_windows",
        f"--measurement-request-count={settings.window_requests}",
        f"--max-trials={settings.max_trials}",
        f"--stability-percentage={settings.stability_percentage:g}",
    ]


def run_point(command: list[str], csv_path: Path, timeout_s: float) -> str:
    """Run one perf_analyzer command; return its CSV text or raise ``PerfAnalyzerError`` with its output."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=perf_analyzer_env()
        )
    except subprocess.TimeoutExpired as exc:
        raise PerfAnalyzerError(f"perf_analyzer did not finish within {timeout_s:g} s: {command}") from exc
    if done.returncode != 0 or not csv_path.is_file():
        output = (done.stdout + done.stderr).strip()[-3000:]
        kind = UnstableMeasurement if _UNSTABLE in output else PerfAnalyzerError
        raise kind(f"perf_analyzer exited with {done.returncode}: {output}")
    return csv_path.read_text()


def measure_point(
    make_command: Callable[[PerfSettings], list[str]], csv_path: Path, settings: PerfSettings
) -> str:
    """Run one load point; when perf_analyzer finds no stable windows, retry once with twice the window
    and three more windows (seen on a loaded machine even with the permissive default stability)."""
    try:
        return run_point(make_command(settings), csv_path, settings.timeout_s)
    except UnstableMeasurement:
        retry = replace(
            settings, window_requests=2 * settings.window_requests, max_trials=settings.max_trials + 3
        )
        log.warning(
            "perf_analyzer: no stable measurement; retrying with %d-request windows", retry.window_requests
        )
        return run_point(make_command(retry), csv_path, settings.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
