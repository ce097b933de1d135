"""TLS from the services to Triton, on the real tritonserver started with ``--grpc-use-ssl`` (and
``--grpc-use-ssl-mutual``), certificates made in the test.

The Triton model is the python-backend test scorer of ``triton_fixtures`` (score = the row's mask sum),
its bundle-hash parameter set to the hash of a small serving bundle, so the real ScoringService can
verify it and serve through it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from triton_fixtures import SCORER, TEST_BUNDLE_HASH, write_scorer_model

from slimserve.bundle import bundle_dir_for, load_bundle
from slimserve.channel import PLAINTEXT, ClientSecurity, open_aio_channel, security_from_files
from slimserve.cli import build_parser
from slimserve.errors import UserError
from slimserve.serving.errors import Unavailable
from slimserve.serving.scoring.config import ScoringServiceConfig
from slimserve.serving.scoring.server import ScoringServer
from slimserve.serving.triton.client import TritonScorerClient
from slimserve.serving.triton.launcher import (
    TritonGrpcTls,
    TritonLaunchError,
    TritonServer,
    TritonServerConfig,
)
from slimserve.settings import ConfigError, config_from_args, load_config
from slimserve.v1 import scoring_pb2_grpc
from tests.test_scoring_service_unit import make_bundle, score_request
from tests.tls_fixtures import other_pki_fixture, pki_fixture  # noqa: F401 (fixtures)

TOKEN = "triton-tls-test-token"


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    """A serving bundle for ``scorer`` and the test scorer model carrying that bundle's hash."""
    repository = make_bundle(tmp_path_factory.mktemp("bundle"))
    model_dir = write_scorer_model(repository, SCORER)
    content_hash = load_bundle(bundle_dir_for(repository, SCORER)).content_hash
    config = model_dir / "config.pbtxt"
    config.write_text(config.read_text().replace(TEST_BUNDLE_HASH, content_hash))
    return repository


def start_triton(repository: Path, directory: Path, grpc_tls: TritonGrpcTls) -> TritonServer:
    config = TritonServerConfig(
        model_repository=repository,
        cache_dir=directory / "cache",
        log_file=directory / "tritonserver.log",
        exit_timeout_s=5,
        startup_timeout_s=60,
        load_models=(SCORER,),
        grpc_tls=grpc_tls,
    )
    return TritonServer(config).start()


@pytest.fixture(scope="module")
def tls_triton(repository, pki, tmp_path_factory):
    """Triton whose gRPC endpoint speaks TLS only (``--grpc-use-ssl``)."""
    server = start_triton(
        repository, tmp_path_factory.mktemp("tls-triton"), TritonGrpcTls(pki.server_cert, pki.server_key)
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mtls_triton(repository, pki, tmp_path_factory):
    """Triton that also asks every client for a certificate signed by the test CA."""
    server = start_triton(
        repository,
        tmp_path_factory.mktemp("mtls-triton"),
        TritonGrpcTls(pki.server_cert, pki.server_key, client_ca=pki.ca),
    )
    yield server
    server.stop()


def command_line(server: TritonServer) -> list[str]:
    return Path(f"/proc/{server.pid}/cmdline").read_bytes().decode().split("\0")


ROWS = np.array([[5, 6, 7, 0], [5, 6, 0, 0]], dtype=np.int64)
MASK = (ROWS != 0).astype(np.int64)


async def scores(url: str, security: ClientSecurity) -> list[float]:
    async with TritonScorerClient(url, model_name=SCORER, security=security) as client:
        assert await client.model_ready(), client.unready_reason
        return (await client.infer_scores(ROWS, MASK, timeout_s=30)).scores.tolist()


async def refusal(url: str, security: ClientSecurity) -> str:
    """The reason a client gets no answer from Triton (model_ready False, infer UNAVAILABLE)."""
    async with TritonScorerClient(url, model_name=SCORER, security=security, control_timeout_s=5) as client:
        assert await client.model_ready() is False
        with pytest.raises(Unavailable, match="Triton is unavailable"):
            await client.infer_scores(ROWS, MASK, timeout_s=5)
        return client.unready_reason


# -- Triton with --grpc-use-ssl -------------------------------------------------------------------------
async def test_tls_client_scores_through_triton_with_grpc_use_ssl(tls_triton, pki):
    args = command_line(tls_triton)
    assert "--grpc-use-ssl=true" in args and f"--grpc-server-cert={pki.server_cert}" in args
    assert not any(a.startswith("--grpc-use-ssl-mutual") for a in args)
    assert await scores(tls_triton.grpc_url, security_from_files(ca=pki.ca)) == [3.0, 2.0]


async def test_plaintext_client_to_tls_triton_fails_with_a_clear_error(tls_triton):
    reason = await refusal(tls_triton.grpc_url, PLAINTEXT)
    assert f"Triton at {tls_triton.grpc_url} did not answer over plaintext: UNAVAILABLE" in reason
    assert "--grpc-use-ssl needs triton_tls and triton_tls_ca_file" in reason


async def test_tls_client_refuses_a_triton_it_does_not_trust(tls_triton, other_pki):
    reason = await refusal(tls_triton.grpc_url, security_from_files(ca=other_pki.ca))
    assert "over TLS: UNAVAILABLE" in reason and "match its certificates" in reason


async def test_mutual_tls_triton_needs_a_client_certificate(mtls_triton, pki, other_pki):
    args = command_line(mtls_triton)
    assert "--grpc-use-ssl-mutual=true" in args and f"--grpc-root-cert={pki.ca}" in args
    with_cert = security_from_files(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
    assert with_cert.transport == "mTLS"
    assert await scores(mtls_triton.grpc_url, with_cert) == [3.0, 2.0]
    await refusal(mtls_triton.grpc_url, security_from_files(ca=pki.ca))  # no certificate
    foreign = security_from_files(ca=pki.ca, cert=other_pki.client_cert, key=other_pki.client_key)
    await refusal(mtls_triton.grpc_url, foreign)


# -- the scoring service over TLS to Triton ------------------------------------------------------------
def serve_flags(repository: Path, triton_url: str, *flags: str) -> ScoringServiceConfig:
    """The service config as ``slimserve serve`` builds it from these flags (derived from the model)."""
    argv = ["serve", "--port=0", "--metrics-port=-1", f"--model-repository={repository}"]
    argv += [f"--triton-url={triton_url}", "--health-poll-interval-s=0.2", "--drain-grace-s=1", *flags]
    return config_from_args(ScoringServiceConfig, build_parser().parse_args(argv), None, environ={})


async def health_status(target: str, security: ClientSecurity | None = None) -> int:
    async with open_aio_channel(target, security) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status


async def test_scoring_service_serves_over_tls_triton_behind_tls_and_a_token(mtls_triton, repository, pki):
    """Client --TLS+token--> ScoringService --mTLS--> Triton; the probe on the plaintext health port."""
    config = serve_flags(
        repository,
        mtls_triton.grpc_url,
        f"--triton-tls-ca-file={pki.ca}",
        f"--triton-tls-cert-file={pki.client_cert}",
        f"--triton-tls-key-file={pki.client_key}",
        f"--tls-cert-file={pki.server_cert}",
        f"--tls-key-file={pki.server_key}",
        f"--auth-tokens={TOKEN}",
        "--health-port=0",
    )
    server = ScoringServer(config)
    await server.start()
    try:
        assert await server.core.watcher.wait_until_ready(timeout=30), server.core.watcher.last_error
        health = f"127.0.0.1:{server.health_port}"
        assert await health_status(health) == health_pb2.HealthCheckResponse.SERVING
        caller = security_from_files(ca=pki.ca, token=TOKEN)
        async with open_aio_channel(f"localhost:{server.port}", caller) as channel:
            reply = await scoring_pb2_grpc.ScoringServiceStub(channel).Score(score_request(3), timeout=30)
        assert len(reply.items) == 3 and all(item.score > 0 for item in reply.items)
        await server.core.watcher.stop()  # the drain's first step: the health port follows
        assert await health_status(health) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        await server.stop(grace=0.5)


async def test_plaintext_service_to_tls_triton_stays_not_serving_and_says_why(tls_triton, repository, caplog):
    server = ScoringServer(serve_flags(repository, tls_triton.grpc_url))
    with caplog.at_level(logging.WARNING, logger="slimserve.serving.health"):
        await server.start()
        try:
            assert await server.core.watcher.check_once() is False
            error = server.core.watcher.last_error
            assert "over plaintext: UNAVAILABLE" in error and "--grpc-use-ssl needs triton_tls" in error
            async with open_aio_channel(f"127.0.0.1:{server.port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await scoring_pb2_grpc.ScoringServiceStub(channel).Score(score_request(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(grace=0.5)
    assert "--grpc-use-ssl needs triton_tls" in caplog.text  # the NOT_SERVING line says why


# -- configuration and launcher checks (no server) ---------------------------------------------------
def test_triton_tls_settings_from_the_environment_and_checked(pki, tmp_path):
    env = {
        "SLIMSERVE_SCORING_TRITON_TLS_CA_FILE": str(pki.ca),
        "SLIMSERVE_SCORING_TRITON_TLS_SERVER_NAME": "triton.internal",
    }
    security = load_config(ScoringServiceConfig, environ=env).triton_security()
    assert security.tls and security.root_certificates == pki.ca.read_bytes()
    assert security.options() == [("grpc.ssl_target_name_override", "triton.internal")]
    assert load_config(ScoringServiceConfig, environ={}).triton_security().transport == "plaintext"
    with pytest.raises(ConfigError, match="triton_tls_cert_file and triton_tls_key_file go together"):
        load_config(ScoringServiceConfig, overrides={"triton_tls_cert_file": pki.client_cert}, environ={})
    with pytest.raises(ConfigError, match="health_port"):
        load_config(ScoringServiceConfig, overrides={"port": 50051, "health_port": 50051}, environ={})
    missing = ScoringServiceConfig(triton_tls_ca_file=tmp_path / "missing.pem")
    with pytest.raises(UserError, match="triton_tls_ca_file"):
        missing.triton_security()


def test_launcher_refuses_missing_tls_files_before_starting(tmp_path, pki):
    tls = TritonGrpcTls(pki.server_cert, tmp_path / "no-key.pem", client_ca=pki.ca)
    assert tls.args() == [
        "--grpc-use-ssl=true",
        f"--grpc-server-cert={pki.server_cert}",
        f"--grpc-server-key={tmp_path / 'no-key.pem'}",
        "--grpc-use-ssl-mutual=true",
        f"--grpc-root-cert={pki.ca}",
    ]
    server = TritonServer(TritonServerConfig(model_repository=tmp_path, grpc_tls=tls))
    with pytest.raises(TritonLaunchError, match=r"no-key\.pem"):
        server.start()
    assert server.pid is None


def test_up_serves_through_a_remote_tls_triton(tls_triton, repository, pki):
    """``slimserve up --teacher-only --triton-url`` with the Triton TLS flags: the sample is answered."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "slimserve.cli", "up", "--teacher-only", "--no-generator"]
    command += [f"--model-repository={repository}", f"--model-name={SCORER}", "--port=0"]
    command += ["--metrics-port=-1", f"--triton-url={tls_triton.grpc_url}", f"--triton-tls-ca-file={pki.ca}"]
    done = subprocess.run(
        [*command, "--exit-after-sample"], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Sample request: rank 10 jobs" in done.stdout and "over TLS" in done.stdout


def test_up_refuses_triton_tls_without_a_remote_triton(pki):
    from slimserve.up_config import UpConfig

    with pytest.raises(ValueError, match="triton_tls_ca_file needs triton_url"):
        UpConfig(triton_tls_ca_file=pki.ca)


def test_bench_triton_refuses_triton_tls_it_cannot_use(pki):
    """The same rules as the services' and up's: a remote Triton for TLS, the key with the certificate."""
    from slimserve.bench.config import TritonBenchConfig

    with pytest.raises(ValueError, match="triton_tls needs triton_url"):
        TritonBenchConfig(triton_tls=True)
    with pytest.raises(ValueError, match="triton_tls_cert_file and triton_tls_key_file go together"):
        TritonBenchConfig(triton_url="127.0.0.1:1", triton_tls_cert_file=pki.client_cert)
    assert TritonBenchConfig().perf_tls() is None
    tls = TritonBenchConfig(triton_url="127.0.0.1:1", triton_tls_ca_file=pki.ca).perf_tls()
    assert tls is not None and tls.ca_file == pki.ca


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_perf_analyzer_drives_a_tls_triton(tls_triton, mtls_triton, repository, pki, mutual):
    """``bench triton``'s perf_analyzer speaks TLS (and mTLS) to a remote Triton; plaintext fails."""
    from slimserve.bench.perf_analyzer import PerfAnalyzerError, PerfSettings, PerfTls
    from slimserve.bench.triton_bench import run_triton_bench
    from slimserve.bench.workload import load_workload

    server = mtls_triton if mutual else tls_triton
    tls = PerfTls(pki.ca, pki.client_cert, pki.client_key) if mutual else PerfTls(pki.ca)
    workload = load_workload(bundle_dir_for(repository, SCORER), requests=4, candidates=2)
    bench = dict(triton_url=server.grpc_url, models=(SCORER,), concurrencies=(1,))
    bench["settings"] = PerfSettings(window_requests=10)
    points = run_triton_bench(repository, workload, tls=tls, **bench)
    assert points and all(p.infer_per_s > 0 for p in points)
    with pytest.raises(PerfAnalyzerError):
        run_triton_bench(repository, workload, **bench)  # plaintext to a TLS-only Triton
