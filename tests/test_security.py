"""TLS, mTLS and bearer tokens on the real grpc.aio scoring server (port 0, Triton on a closed port).

Certificates are made in the test. A call that gets past TLS and the token check reaches the servicer
and fails UNAVAILABLE (no Triton): that is how these tests tell "let in" from "refused".
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from slimserve.bench.grpc_load import LoadPlan, bench_service
from slimserve.channel import ClientSecurity, add_client_security_flags, open_aio_channel, security_from_args
from slimserve.client import score_once
from slimserve.errors import UserError
from slimserve.examples import EXAMPLE_MEMBER, example_candidates
from slimserve.serving import security
from slimserve.serving.scoring.config import ScoringServiceConfig
from slimserve.serving.scoring.server import ScoringServer
from slimserve.serving.security import TokenSet, bearer_token, check_plaintext_bind, is_loopback
from slimserve.settings import ConfigError, load_config
from slimserve.v1 import scoring_pb2_grpc
from tests.test_scoring_service_unit import config_for, make_bundle, score_request
from tests.tls_fixtures import other_pki_fixture, pki_fixture  # noqa: F401 (fixtures)

TOKENS = ["token-old", "token-new"]


async def started(tmp_path, **changes) -> ScoringServer:
    server = ScoringServer(config_for(make_bundle(tmp_path), **changes))
    await server.start()
    return server


def tls_files(pki, directory, mtls: bool = False) -> dict:
    """Server TLS settings pointing at copies (so a test may rotate them)."""
    directory.mkdir(exist_ok=True)
    cert = shutil.copy(pki.server_cert, directory / "tls.crt")
    key = shutil.copy(pki.server_key, directory / "tls.key")
    files = {"tls_cert_file": cert, "tls_key_file": key}
    if mtls:
        files["tls_client_ca_file"] = shutil.copy(pki.ca, directory / "ca.crt")
    return files


def client(pki, *, cert: bool = False, token: str | None = None) -> ClientSecurity:
    return ClientSecurity(
        tls=True,
        root_certificates=pki.ca.read_bytes(),
        certificate_chain=pki.client_cert.read_bytes() if cert else None,
        private_key=pki.client_key.read_bytes() if cert else None,
        token=token,
    )


async def health_code(port: int, security_: ClientSecurity | None = None) -> grpc.StatusCode:
    """OK when a health check is answered (NOT_SERVING here), else the status of the failure."""
    async with open_aio_channel(f"localhost:{port}", security_) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def score_error(port: int, security_: ClientSecurity | None = None) -> grpc.aio.AioRpcError:
    async with open_aio_channel(f"localhost:{port}", security_) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await scoring_pb2_grpc.ScoringServiceStub(channel).Score(score_request(), timeout=5)
    return info.value


async def reflection_code(port: int) -> grpc.StatusCode:
    """The status of a plaintext reflection call that lists the services (OK when it is answered)."""
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    async with open_aio_channel(f"127.0.0.1:{port}") as channel:
        try:
            async for _ in reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([request]), timeout=5
            ):
                pass
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


# -- TLS and mTLS ---------------------------------------------------------------------------------------
async def test_plaintext_client_refused_on_tls_port(tmp_path, pki):
    server = await started(tmp_path, **tls_files(pki, tmp_path / "tls"))
    try:
        assert await health_code(server.port) == grpc.StatusCode.UNAVAILABLE
        assert await health_code(server.port, client(pki)) == grpc.StatusCode.OK
        assert (await score_error(server.port, client(pki))).code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(grace=0.5)


async def test_tls_client_refuses_a_server_it_does_not_trust(tmp_path, pki, other_pki):
    server = await started(tmp_path, **tls_files(pki, tmp_path / "tls"))
    try:
        assert await health_code(server.port, client(other_pki)) == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(grace=0.5)


async def test_mtls_refuses_clients_without_a_trusted_certificate(tmp_path, pki, other_pki):
    server = await started(tmp_path, **tls_files(pki, tmp_path / "tls", mtls=True))
    try:
        assert await health_code(server.port, client(pki)) == grpc.StatusCode.UNAVAILABLE  # no certificate
        foreign = ClientSecurity(
            tls=True,
            root_certificates=pki.ca.read_bytes(),
            certificate_chain=other_pki.client_cert.read_bytes(),
            private_key=other_pki.client_key.read_bytes(),
        )
        assert await health_code(server.port, foreign) == grpc.StatusCode.UNAVAILABLE
        assert await health_code(server.port, client(pki, cert=True)) == grpc.StatusCode.OK
        reflection = reflection_pb2_grpc.ServerReflectionStub
        async with open_aio_channel(f"localhost:{server.port}", client(pki, cert=True)) as channel:
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            replies = [r async for r in reflection(channel).ServerReflectionInfo(iter([request]), timeout=5)]
        assert replies  # reflection on the same port, under mTLS
    finally:
        await server.stop(grace=0.5)


async def test_rotated_certificate_is_served_to_new_connections(tmp_path, pki, other_pki):
    files = tls_files(pki, tmp_path / "tls")
    server = await started(tmp_path, **files)
    try:
        assert await health_code(server.port, client(pki)) == grpc.StatusCode.OK
        shutil.copy(other_pki.server_cert, files["tls_cert_file"])  # cert-manager renews the secret
        shutil.copy(other_pki.server_key, files["tls_key_file"])
        assert await health_code(server.port, client(other_pki)) == grpc.StatusCode.OK
        assert await health_code(server.port, client(pki)) == grpc.StatusCode.UNAVAILABLE
        assert server.certificates.reloads == 1
    finally:
        await server.stop(grace=0.5)


async def test_broken_rotation_keeps_the_previous_certificate(tmp_path, pki, other_pki, caplog):
    files = tls_files(pki, tmp_path / "tls")
    server = await started(tmp_path, **files)
    try:
        shutil.copy(other_pki.server_cert, files["tls_cert_file"])  # the key no longer matches
        with caplog.at_level(logging.WARNING, logger="slimserve.serving.security"):
            assert await health_code(server.port, client(pki)) == grpc.StatusCode.OK
        assert "keeping the previous ones" in caplog.text and server.certificates.reloads == 0
    finally:
        await server.stop(grace=0.5)


def test_tls_settings_checked_up_front(tmp_path, pki):
    with pytest.raises(ConfigError, match="go together"):
        load_config(ScoringServiceConfig, overrides={"tls_cert_file": str(pki.server_cert)}, environ={})
    with pytest.raises(ConfigError, match="needs tls_cert_file"):
        load_config(ScoringServiceConfig, overrides={"tls_client_ca_file": str(pki.ca)}, environ={})
    mismatched = {"tls_cert_file": pki.server_cert, "tls_key_file": pki.client_key}
    with pytest.raises(ConfigError, match="do not load"):
        security.server_credentials(ScoringServiceConfig(**mismatched))


# -- plaintext only on loopback -------------------------------------------------------------------------
def test_plaintext_refused_off_loopback_unless_allowed(pki):
    for host in ("127.0.0.1", "::1", "localhost"):
        check_plaintext_bind(ScoringServiceConfig(host=host))
    with pytest.raises(ConfigError, match="allow_plaintext") as info:
        check_plaintext_bind(ScoringServiceConfig(host="0.0.0.0"))
    assert "--allow-plaintext" in str(info.value) and "--tls-cert-file" in str(info.value)
    check_plaintext_bind(ScoringServiceConfig(host="0.0.0.0", allow_plaintext=True))
    tls = {"tls_cert_file": pki.server_cert, "tls_key_file": pki.server_key}
    check_plaintext_bind(ScoringServiceConfig(host="0.0.0.0", **tls))
    assert not is_loopback("0.0.0.0") and not is_loopback("::")


async def test_server_start_refuses_plaintext_on_all_interfaces(tmp_path):
    server = ScoringServer(config_for(make_bundle(tmp_path), host="0.0.0.0"))
    with pytest.raises(ConfigError, match="refusing to serve plaintext"):
        await server.start()
    await server.stop(grace=0)


async def test_health_port_answers_only_health_in_plaintext(tmp_path, pki):
    """The probe port under TLS and tokens: plaintext, no token, grpc.health.v1 and nothing else."""
    server = await started(tmp_path, auth_tokens=TOKENS, health_port=0, **tls_files(pki, tmp_path / "tls"))
    try:
        assert server.health_port not in (None, 0, server.port)
        assert await health_code(server.health_port) == grpc.StatusCode.OK  # NOT_SERVING: no Triton
        assert await health_code(server.port) == grpc.StatusCode.UNAVAILABLE  # the service port: TLS only
        assert (await score_error(server.health_port)).code() == grpc.StatusCode.UNIMPLEMENTED
        token = ClientSecurity(token=TOKENS[0])
        assert (await score_error(server.health_port, token)).code() == grpc.StatusCode.UNIMPLEMENTED
        assert await reflection_code(server.health_port) == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(grace=0.5)
    assert await health_code(server.health_port) == grpc.StatusCode.UNAVAILABLE  # closed with the service


# -- bearer tokens --------------------------------------------------------------------------------------
async def test_tokens_required_health_open(tmp_path, caplog):
    server = await started(tmp_path, auth_tokens=TOKENS)
    try:
        plain = ClientSecurity
        with caplog.at_level(logging.WARNING, logger="slimserve.serving.security"):
            missing = await score_error(server.port)
            wrong = await score_error(server.port, plain(token="token-wrong"))
        assert missing.code() == wrong.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "no bearer token" in missing.details() and "not accepted" in wrong.details()
        assert "ScoringService/Score" in caplog.text and "127.0.0.1" in caplog.text
        assert "token-wrong" not in caplog.text  # the method and the caller are logged, never the token
        for token in TOKENS:  # either token of a rotation lets the call through to the servicer
            assert (await score_error(server.port, plain(token=token))).code() == grpc.StatusCode.UNAVAILABLE
        assert await health_code(server.port) == grpc.StatusCode.OK  # probes need no token
        assert await reflection_code(server.port) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await server.stop(grace=0.5)


async def test_token_and_mtls_together(tmp_path, pki, caplog):
    server = await started(tmp_path, auth_tokens=TOKENS, **tls_files(pki, tmp_path / "tls", mtls=True))
    try:
        with caplog.at_level(logging.WARNING, logger="slimserve.serving.security"):
            no_token = await score_error(server.port, client(pki, cert=True))
        assert "(client.test)" in caplog.text  # the caller's certificate names it in the log
        assert no_token.code() == grpc.StatusCode.UNAUTHENTICATED
        let_in = await score_error(server.port, client(pki, cert=True, token=TOKENS[0]))
        assert let_in.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(grace=0.5)


def test_token_file_is_re_read_when_it_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(security, "TOKEN_FILE_CHECK_INTERVAL_S", 0.0)
    path = tmp_path / "tokens"
    path.write_text("# rotation: old and new\nalpha\n\nbeta\n")
    tokens = TokenSet(file=path)
    assert len(tokens) == 2 and tokens.accepts("alpha") and tokens.accepts("beta")
    assert not tokens.accepts("alph") and not tokens.accepts("")
    path.write_text("gamma\n")
    assert tokens.accepts("gamma") and not tokens.accepts("alpha")
    path.unlink()  # a missing file keeps the tokens it had
    assert tokens.accepts("gamma")
    with pytest.raises(ConfigError, match=r"auth_tokens_file .*No such file"):
        TokenSet(file=tmp_path / "empty")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="holds none"):
        TokenSet(file=tmp_path / "empty")


def test_tokens_from_the_environment_comma_separated():
    env = {"SLIMSERVE_SCORING_AUTH_TOKENS": "s3cret-a, s3cret-b"}
    config = load_config(ScoringServiceConfig, environ=env)
    assert [t.get_secret_value() for t in config.auth_tokens] == ["s3cret-a", "s3cret-b"]
    assert "s3cret" not in repr(config)  # secrets stay out of logs of the config
    assert bearer_token("Bearer abc") == bearer_token("bearer abc ") == "abc"
    assert (
        bearer_token("Basic abc") is None and bearer_token(None) is None and bearer_token("Bearer ") is None
    )


async def test_metrics_can_require_the_token(tmp_path):
    server = await started(tmp_path, auth_tokens=TOKENS, metrics_require_token=True)
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"

    def get(token: str | None) -> int:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                return reply.status
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        assert await asyncio.to_thread(get, None) == 401
        assert await asyncio.to_thread(get, "nope") == 401
        assert await asyncio.to_thread(get, TOKENS[1]) == 200
    finally:
        await server.stop(grace=0.5)


def test_metrics_token_needs_tokens():
    with pytest.raises(ConfigError, match="metrics_require_token"):
        load_config(ScoringServiceConfig, overrides={"metrics_require_token": True}, environ={})


# -- the CLI clients ------------------------------------------------------------------------------------
def parse_client_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_client_security_flags(parser)
    return parser.parse_args(argv)


def test_client_flags(pki, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    args = parse_client_flags("--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert), "--tls-key",
                              str(pki.client_key), "--token-file", str(token_file))  # fmt: skip
    chosen = security_from_args(args, environ={})
    assert chosen.tls and chosen.certificate_chain and chosen.token == "from-file"
    assert security_from_args(parse_client_flags(), environ={"SLIMSERVE_TOKEN": "env"}).token == "env"
    assert not security_from_args(parse_client_flags(), environ={}).tls
    with pytest.raises(UserError, match="go together"):
        security_from_args(parse_client_flags("--tls-cert", str(pki.client_cert)), environ={})
    with pytest.raises(UserError, match="--tls-ca"):
        security_from_args(parse_client_flags("--tls-ca", str(tmp_path / "missing.pem")), environ={})


async def test_score_and_bench_clients_speak_mtls_with_a_token(tmp_path, pki):
    server = await started(tmp_path, auth_tokens=TOKENS, **tls_files(pki, tmp_path / "tls", mtls=True))
    target = f"localhost:{server.port}"
    candidates = example_candidates(2)
    try:
        for token, expected in ((TOKENS[0], "UNAVAILABLE"), ("wrong", "UNAUTHENTICATED")):
            chosen = client(pki, cert=True, token=token)
            with pytest.raises(UserError, match=f"Score failed: {expected}"):
                await asyncio.to_thread(score_once, target, EXAMPLE_MEMBER, candidates, 0, 5.0, chosen)
        plan = LoadPlan(concurrencies=(1,), max_requests=2, max_seconds=5.0, warmup_requests=0, timeout_s=5.0)
        requests = [score_request()]
        points = await bench_service(
            target, "Score", requests, plan, security=client(pki, cert=True, token="x")
        )
        assert set(points[0].errors) == {"UNAUTHENTICATED"}
    finally:
        await server.stop(grace=0.5)
