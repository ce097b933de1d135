"""Who may talk to a service: TLS and mTLS credentials that follow their files, the plaintext-bind rule,
and bearer tokens checked by a server interceptor.

``server_credentials`` gives grpc's dynamic SSL credentials: grpc asks ``ReloadingCertificates`` for the
certificate on each new connection, and it re-reads the files only when one changed (cert-manager swaps
a Kubernetes secret under a running pod); a new pair that does not load is logged and the old one kept.
``check_plaintext_bind`` refuses plaintext on a non-loopback address unless ``allow_plaintext`` says so.
``TokenSet`` holds the accepted tokens (config list plus a file it re-reads on change) and compares in
constant time; ``TokenInterceptor`` answers UNAUTHENTICATED to a call without a valid
``authorization: Bearer <token>``, logging the method and the caller (never the token). grpc.health.v1
stays open for probes.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import grpc

from ..settings import ConfigError
from .config import GrpcServiceConfig

log = logging.getLogger(__name__)

AUTHORIZATION_METADATA = "authorization"
BEARER_PREFIX = "bearer "
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
TOKEN_FILE_CHECK_INTERVAL_S = 1.0


# -- plaintext rule -------------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback one (``0.0.0.0`` and ``::`` are not)."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def check_plaintext_bind(config: GrpcServiceConfig) -> None:
    """Refuse to serve plaintext on a non-loopback host unless ``allow_plaintext`` is set."""
    if config.uses_tls or config.allow_plaintext or is_loopback(config.host):
        return
    raise ConfigError(
        f"refusing to serve plaintext gRPC on {config.host} (not loopback): set tls_cert_file and "
        "tls_key_file (--tls-cert-file, --tls-key-file) to serve TLS, or allow_plaintext "
        "(--allow-plaintext) when the network already encrypts (a service mesh)"
    )


# -- TLS ------------------------------------------------------------------------------------------------
def _signature(paths: Iterable[Path]) -> tuple:
    """What changes when a file is rewritten or its Kubernetes secret symlink is swapped."""
    out = []
    for path in paths:
        st = os.stat(path)
        out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


class ReloadingCertificates:
    """The server's certificate configuration, read again whenever its files change.

    Called by grpc (``dynamic_ssl_server_credentials``) before each new connection's handshake: returns
    None (keep the current configuration) or a new ``ssl_server_certificate_configuration``.
    """

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None = None):
        self.cert_file, self.key_file, self.client_ca_file = cert_file, key_file, client_ca_file
        self._lock = threading.Lock()
        self.reloads = 0
        self._signature, self.current = self._load()  # a broken start is a ConfigError

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p is not None)

    def _load(self):
        """(signature, configuration) of the files as they are now; ConfigError when they do not load."""
        try:
            signature = _signature(self.paths)
            cert, key = self.cert_file.read_bytes(), self.key_file.read_bytes()
            client_ca = self.client_ca_file.read_bytes() if self.client_ca_file else None
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.cert_file, self.key_file)  # the key matches the certificate
            if client_ca is not None:
                context.load_verify_locations(cadata=client_ca.decode("ascii"))
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise ConfigError(f"TLS files {', '.join(map(str, self.paths))} do not load: {exc}") from None
        configuration = grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=client_ca)
        return signature, configuration

    def __call__(self):
        with self._lock:
            try:
                if _signature(self.paths) == self._signature:
                    return None
                self._signature, self.current = self._load()
            except (OSError, ConfigError) as exc:
                log.warning("TLS files changed but do not load, keeping the previous ones: %s", exc)
                return None
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.cert_file)
            return self.current


def server_credentials(config: GrpcServiceConfig) -> tuple[grpc.ServerCredentials, ReloadingCertificates]:
    """TLS credentials for the gRPC port (client certificates required when a client CA is set)."""
    assert config.tls_cert_file is not None and config.tls_key_file is not None
    certificates = ReloadingCertificates(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)
    credentials = grpc.dynamic_ssl_server_credentials(
        certificates.current,
        certificates,
        require_client_authentication=config.tls_client_ca_file is not None,
    )
    return credentials, certificates


def describe_transport(config: GrpcServiceConfig) -> str:
    """ "mTLS", "TLS" or "plaintext", for the start-up log line."""
    if not config.uses_tls:
        return "plaintext"
    return "mTLS" if config.tls_client_ca_file is not None else "TLS"


# -- tokens ---------------------------------------------------------------------------------------------
def read_token_file(path: Path) -> list[str]:
    """Tokens of a file: one a line; blank lines and ``#`` comments skipped."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


class TokenSet:
    """The accepted bearer tokens: fixed ones plus a file's, the file re-read when it changes."""

    def __init__(self, tokens: Iterable[str] = (), file: Path | None = None):
        self._fixed = [t.encode() for t in tokens if t]
        self.file = file
        self._file_tokens: list[bytes] = []
        self._file_signature: tuple | None = None
        self._checked_at = 0.0
        self._lock = threading.Lock()
        if file is not None:
            try:
                self._read_file()
            except OSError as exc:
                raise ConfigError(f"auth_tokens_file {file}: {exc}") from None
        if not self._fixed and not self._file_tokens:
            raise ConfigError(f"no bearer token configured (auth_tokens_file {file} holds none)")

    @classmethod
    def from_config(cls, config: GrpcServiceConfig) -> TokenSet | None:
        """The config's tokens, or None when the service asks for none."""
        if not config.uses_tokens:
            return None
        return cls([t.get_secret_value() for t in config.auth_tokens], config.auth_tokens_file)

    def __len__(self) -> int:
        return len(self._fixed) + len(self._file_tokens)

    def _read_file(self) -> None:
        assert self.file is not None
        signature = _signature([self.file])
        self._file_tokens = [t.encode() for t in read_token_file(self.file)]
        self._file_signature = signature

    def _refresh(self) -> None:
        now = time.monotonic()
        if self.file is None or now - self._checked_at < TOKEN_FILE_CHECK_INTERVAL_S:
            return
        with self._lock:
            self._checked_at = now
            try:
                if _signature([self.file]) != self._file_signature:
                    self._read_file()
                    log.info("bearer tokens reloaded from %s (%d tokens)", self.file, len(self))
            except OSError as exc:
                log.warning("cannot re-read auth_tokens_file, keeping its previous tokens: %s", exc)

    def accepts(self, token: str) -> bool:
        """True when ``token`` is one of the accepted ones; every token compared, in constant time."""
        self._refresh()
        presented = token.encode()
        found = False
        for accepted in (*self._fixed, *self._file_tokens):
            found |= hmac.compare_digest(accepted, presented)
        return found


def bearer_token(value: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (None when absent or another scheme)."""
    if not value or value[: len(BEARER_PREFIX)].lower() != BEARER_PREFIX:
        return None
    return value[len(BEARER_PREFIX) :].strip() or None


def _caller(context: grpc.aio.ServicerContext) -> str:
    """The peer address, and the client certificate's common name under mTLS."""
    names = context.auth_context().get("x509_common_name") or ()
    name = b",".join(names).decode(errors="replace")
    return f"{context.peer()} ({name})" if name else context.peer()


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for every call without an accepted bearer token, health excepted."""

    def __init__(self, tokens: TokenSet, open_prefixes: tuple[str, ...] = OPEN_PREFIXES):
        self._tokens = tokens
        self._open = open_prefixes

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(self._open):
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        token = bearer_token(metadata.get(AUTHORIZATION_METADATA))
        if token is not None and self._tokens.accepts(token):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        problem = "no bearer token" if token is None else "bearer token not accepted"
        return _refusing_handler(handler, method, problem)


def _refusing_handler(handler: grpc.RpcMethodHandler, method: str, problem: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that answers UNAUTHENTICATED without running it."""

    async def refuse(request_or_iterator, context):
        log.warning("%s refused (%s) for %s", method, problem, _caller(context))
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{problem} (authorization: Bearer <token>)")

    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(refuse, **codec)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(refuse, **codec)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(refuse, **codec)
    return grpc.stream_stream_rpc_method_handler(refuse, **codec)
