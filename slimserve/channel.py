"""Client channels of the CLI tools (``score``, ``explain``, ``generate``, ``bench grpc``, ``bench latency``):
plaintext, TLS or mTLS, and a bearer token sent as ``authorization`` metadata on every call.

``add_client_security_flags`` adds the same flags to each command; ``security_from_args`` reads them
(the token also from ``SLIMSERVE_TOKEN``); ``open_channel`` and ``open_aio_channel`` build the channel.
``security_from_files`` is the one place PEM files become a ``ClientSecurity``: the CLI flags and the
services' connection to Triton (``triton_tls_*`` settings) both go through it.
The token goes through a client interceptor, so it works on a plaintext loopback channel too. grpc is
imported only when a channel is opened (the flags are added while ``--help`` is built).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UserError

TOKEN_ENV = "SLIMSERVE_TOKEN"


@dataclass(frozen=True)
class ClientSecurity:
    """How a client reaches a service: TLS material (PEM bytes) and a bearer token."""

    tls: bool = False
    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    server_name: str | None = None
    token: str | None = None

    def credentials(self):
        """``grpc.ChannelCredentials`` for TLS (None: plaintext)."""
        if not self.tls:
            return None
        import grpc

        return grpc.ssl_channel_credentials(self.root_certificates, self.private_key, self.certificate_chain)

    def options(self) -> list[tuple[str, str]]:
        """Channel options: the name the server's certificate must carry, when not the target's host."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    @property
    def transport(self) -> str:
        """ "mTLS", "TLS" or "plaintext", for log lines."""
        if not self.tls:
            return "plaintext"
        return "mTLS" if self.certificate_chain is not None else "TLS"

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


PLAINTEXT = ClientSecurity()


def add_client_security_flags(parser: argparse.ArgumentParser) -> None:
    """``--tls``, ``--tls-ca``, ``--tls-cert``, ``--tls-key``, ``--tls-server-name``, ``--token``,
    ``--token-file``."""
    group = parser.add_argument_group("security (default: plaintext, no token)")
    group.add_argument("--tls", action="store_true", help="speak TLS (the system's CA certificates)")
    group.add_argument(
        "--tls-ca", type=Path, help="CA certificate (PEM) to check the server with; implies --tls"
    )
    group.add_argument("--tls-cert", type=Path, help="client certificate (PEM) for mTLS; implies --tls")
    group.add_argument("--tls-key", type=Path, help="private key (PEM) of --tls-cert")
    group.add_argument(
        "--tls-server-name", help="name the server's certificate must carry (when --target is an address)"
    )
    group.add_argument(
        "--token", help=f"bearer token (shows in ps: prefer --token-file or {TOKEN_ENV} in the environment)"
    )
    group.add_argument("--token-file", type=Path, help="file whose first line is the bearer token")


def _read(path: Path | None, flag: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"{flag} {path}: {exc}") from None


# The settings of a service's (or a benchmark's) connection to a Triton given by triton_url.
TRITON_TLS_FIELDS = (
    "triton_tls",
    "triton_tls_ca_file",
    "triton_tls_cert_file",
    "triton_tls_key_file",
    "triton_tls_server_name",
)


def check_triton_tls(config: Any, started_here: str | None = None) -> None:
    """Raise ``ValueError`` where ``config``'s ``triton_tls*`` fields do not fit together: the client
    certificate needs its key; with ``started_here`` (why: the Triton is started locally, in plaintext)
    none may be set without ``triton_url``. One rule for every config that has these fields."""
    if started_here is not None and getattr(config, "triton_url", None) is None:
        chosen = [name for name in TRITON_TLS_FIELDS if getattr(config, name, None)]
        if chosen:
            raise ValueError(f"{chosen[0]} needs triton_url: {started_here}")
    if (config.triton_tls_cert_file is None) != (config.triton_tls_key_file is None):
        raise ValueError("triton_tls_cert_file and triton_tls_key_file go together: set both or neither")


def security_from_files(
    *,
    tls: bool = False,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    server_name: str | None = None,
    token: str | None = None,
    names: tuple[str, str, str] = ("--tls-ca", "--tls-cert", "--tls-key"),
) -> ClientSecurity:
    """A ``ClientSecurity`` from PEM files: TLS when ``tls`` or any file is given (``ca`` unset: the
    system's CA certificates), a client certificate (mTLS) when ``cert`` and ``key`` are. ``names`` are
    how the caller calls the three files (flags, config fields), for the error messages."""
    if (cert is None) != (key is None):
        raise UserError(f"{names[1]} and {names[2]} go together")
    return ClientSecurity(
        tls=bool(tls or ca or cert),
        root_certificates=_read(ca, names[0]),
        certificate_chain=_read(cert, names[1]),
        private_key=_read(key, names[2]),
        server_name=server_name,
        token=token,
    )


def security_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ClientSecurity:
    """The ``ClientSecurity`` of parsed ``add_client_security_flags`` flags."""
    environ = os.environ if environ is None else environ
    token = args.token
    if token is None and args.token_file is not None:
        lines = (_read(args.token_file, "--token-file") or b"").decode().splitlines()
        token = lines[0].strip() if lines else ""
        if not token:
            raise UserError(f"--token-file {args.token_file}: empty")
    if token is None:
        token = environ.get(TOKEN_ENV) or None
    return security_from_files(
        tls=args.tls,
        ca=args.tls_ca,
        cert=args.tls_cert,
        key=args.tls_key,
        server_name=args.tls_server_name,
        token=token,
    )


def _with_metadata(details, extra: tuple[tuple[str, str], ...], details_class):
    metadata = (*(tuple(details.metadata) if details.metadata else ()), *extra)
    return details_class(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


def _sync_token_interceptor(extra: tuple[tuple[str, str], ...]):
    """A blocking-channel interceptor adding ``extra`` metadata to every call."""
    import grpc

    class Details(grpc.ClientCallDetails):
        def __init__(self, method, timeout, metadata, credentials, wait_for_ready):
            self.method, self.timeout, self.metadata = method, timeout, metadata
            self.credentials, self.wait_for_ready = credentials, wait_for_ready

    class Token(
        grpc.UnaryUnaryClientInterceptor,
        grpc.UnaryStreamClientInterceptor,
        grpc.StreamUnaryClientInterceptor,
        grpc.StreamStreamClientInterceptor,
    ):
        def _call(self, continuation, details, request):
            return continuation(_with_metadata(details, extra, Details), request)

        intercept_unary_unary = intercept_unary_stream = _call
        intercept_stream_unary = intercept_stream_stream = _call

    return Token()


def open_channel(target: str, security: ClientSecurity | None = None):
    """A blocking ``grpc.Channel`` to ``target`` (use it in a ``with``)."""
    import grpc

    security = security or PLAINTEXT
    credentials = security.credentials()
    if credentials is None:
        channel = grpc.insecure_channel(target, options=security.options())
    else:
        channel = grpc.secure_channel(target, credentials, options=security.options())
    if security.metadata():
        channel = grpc.intercept_channel(channel, _sync_token_interceptor(security.metadata()))
    return channel


def _aio_token_interceptors(extra: tuple[tuple[str, str], ...]) -> list:
    """asyncio interceptors (one per call kind: grpc.aio files each under one) adding ``extra``."""
    from grpc import aio

    def details(d):
        return _with_metadata(d, extra, aio.ClientCallDetails)

    class UnaryUnary(aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, d, request):
            return await continuation(details(d), request)

    class UnaryStream(aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation, d, request):
            return await continuation(details(d), request)

    class StreamUnary(aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation, d, requests):
            return await continuation(details(d), requests)

    class StreamStream(aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation, d, requests):
            return await continuation(details(d), requests)

    return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]


def open_aio_channel(target: str, security: ClientSecurity | None = None, options: list | None = None):
    """A ``grpc.aio.Channel`` to ``target`` (use it in an ``async with``)."""
    from grpc import aio

    security = security or PLAINTEXT
    extra = security.metadata()
    interceptors = _aio_token_interceptors(extra) if extra else None
    all_options = [*(options or []), *security.options()]
    credentials = security.credentials()
    if credentials is None:
        return aio.insecure_channel(target, options=all_options, interceptors=interceptors)
    return aio.secure_channel(target, credentials, options=all_options, interceptors=interceptors)
