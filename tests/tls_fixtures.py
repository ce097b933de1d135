"""Certificates made in the test (the ``cryptography`` package): a CA, server and client certificates.

``make_pki(directory)`` writes ``ca.pem``, ``server.pem``/``server-key.pem`` (for localhost and
127.0.0.1) and ``client.pem``/``client-key.pem`` signed by that CA; ``other`` names a second, unrelated
CA's set for the negative cases. The fixtures ``pki`` and ``other_pki`` (one of each per test module) are
used by importing their functions (``*_fixture``; pytest registers them by ``name``).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(common_name: str, key, issuer_key, issuer_name: x509.Name, *, ca: bool, usage=None):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, certificate=None, key=None) -> Path:
    if certificate is not None:
        path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return path


def make_pki(directory: Path, ca_name: str = "slimserve test CA") -> Pki:
    """A CA with one server and one client certificate, written as PEM files under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate(ca_name, ca_key, ca_key, _name(ca_name), ca=True)
    files = {"ca": _write(directory / "ca.pem", ca)}
    for role, usage in (
        ("server", ExtendedKeyUsageOID.SERVER_AUTH),
        ("client", ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(f"{role}.test", key, ca_key, ca.subject, ca=False, usage=usage)
        files[f"{role}_cert"] = _write(directory / f"{role}.pem", cert)
        files[f"{role}_key"] = _write(directory / f"{role}-key.pem", key=key)
    return Pki(**files)


@pytest.fixture(scope="module", name="pki")
def pki_fixture(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module", name="other_pki")
def other_pki_fixture(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Certificates of an unrelated CA: what a client or server must not trust."""
    return make_pki(tmp_path_factory.mktemp("other-pki"), ca_name="some other CA")
