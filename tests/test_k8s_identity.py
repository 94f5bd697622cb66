"""`gpuagent mqtt-identity`: a node's MQTT client certificate through a cert-manager
CertificateRequest, against the test API server acting as cert-manager (it signs with a CA
made here)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuagent.cli import main
from kubernetes_api import FakeApiServer, make_node, serve, write_kubeconfig

REQUESTS = "/apis/cert-manager.io/v1/namespaces/gpuagent/certificaterequests"


def _ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuagent test CA")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, certificate


@dataclass
class CertManager(FakeApiServer):
    """The API server with cert-manager's CertificateRequests: each is signed (or denied)
    on its ``pending``-th read after creation."""

    verdict: str = "sign"  # "sign", "deny" or "never"
    pending: int = 2
    stored: dict[str, Any] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate] = field(default_factory=_ca)

    def handle(self, method: str, path: str, content_type: str, raw: bytes) -> tuple[int, Any]:
        if not path.startswith(REQUESTS):
            return super().handle(method, path, content_type, raw)
        request = json.loads(raw) if raw else None
        name = path.removeprefix(REQUESTS).strip("/")
        if method == "POST":
            name = request["metadata"]["generateName"] + f"x{len(self.stored)}"
            request["metadata"]["name"] = name
            request["reads"] = 0
            self.stored[name] = request
            return 201, request
        if name not in self.stored:
            return 404, {"kind": "Status", "code": 404, "message": "not found"}
        if method == "DELETE":
            self.deleted.append(name)
            return 200, self.stored.pop(name)
        stored = self.stored[name]
        stored["reads"] += 1
        if stored["reads"] >= self.pending and self.verdict != "never":
            stored["status"] = self._verdict(stored)
        return 200, stored

    def _verdict(self, request: Any) -> Any:
        if self.verdict == "deny":
            denied = {"type": "Denied", "status": "True", "reason": "Policy", "message": "no"}
            return {"conditions": [denied]}
        csr = x509.load_pem_x509_csr(base64.b64decode(request["spec"]["request"]))
        key, ca = self.ca
        now = dt.datetime.now(dt.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(csr.subject)
            .issuer_name(ca.subject)
            .public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(key, hashes.SHA256())
        )

        def pem(cert: x509.Certificate) -> str:
            return base64.b64encode(cert.public_bytes(serialization.Encoding.PEM)).decode()

        ready = {"type": "Ready", "status": "True", "reason": "Issued", "message": "ok"}
        return {"conditions": [ready], "certificate": pem(certificate), "ca": pem(ca)}


@pytest.fixture
def cert_manager() -> Iterator[CertManager]:
    with serve(CertManager(make_node())) as fake:
        yield fake


def _run(fake: CertManager, tmp_path: Path, *extra: str) -> int:
    kubeconfig = write_kubeconfig(tmp_path / "kc", fake)
    return main(
        [
            "mqtt-identity",
            "--node-name=gpu-node-7",
            f"--dir={tmp_path / 'identity'}",
            "--issuer=gpuagent-ca",
            "--namespace=gpuagent",
            f"--kubeconfig={kubeconfig}",
            *extra,
        ]
    )


def test_a_signed_request_gives_key_certificate_and_ca(cert_manager, tmp_path, capsys) -> None:
    assert _run(cert_manager, tmp_path) == 0
    identity = tmp_path / "identity"
    key = serialization.load_pem_private_key((identity / "tls.key").read_bytes(), None)
    certificate = x509.load_pem_x509_certificate((identity / "tls.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((identity / "ca.crt").read_bytes())
    assert stat.S_IMODE((identity / "tls.key").stat().st_mode) == 0o600
    # The broker's ACL keys on the CN: the node's name.
    cn = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert [a.value for a in cn] == ["gpu-node-7"]
    assert certificate.public_key() == key.public_key()
    certificate.verify_directly_issued_by(ca)
    # What went to cert-manager, and that the request is gone again.
    [name] = cert_manager.deleted
    assert name.startswith("gpuagent-mqtt-gpu-node-7-")
    assert cert_manager.stored == {}
    assert "CN=gpu-node-7" in capsys.readouterr().out


def test_the_request_asks_for_a_client_certificate(cert_manager, tmp_path) -> None:
    seen: list[Any] = []
    original = cert_manager.handle

    def spy(method: str, path: str, content_type: str, raw: bytes) -> tuple[int, Any]:
        if method == "POST":
            seen.append(json.loads(raw))
        return original(method, path, content_type, raw)

    cert_manager.handle = spy  # type: ignore[method-assign]
    assert _run(cert_manager, tmp_path, "--duration-hours=720") == 0
    [request] = seen
    spec = request["spec"]
    assert spec["issuerRef"] == {
        "name": "gpuagent-ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert spec["usages"] == ["client auth", "digital signature"]
    assert spec["duration"] == "720h"
    csr = x509.load_pem_x509_csr(base64.b64decode(spec["request"]))
    assert csr.is_signature_valid
    assert csr.subject.rfc4514_string() == "CN=gpu-node-7"


def test_a_denied_request_fails_and_writes_nothing(cert_manager, tmp_path, capsys) -> None:
    cert_manager.verdict = "deny"
    assert _run(cert_manager, tmp_path) == 1
    assert "denied (Policy: no)" in capsys.readouterr().err
    assert not (tmp_path / "identity").exists()
    assert len(cert_manager.deleted) == 1


def test_a_request_never_signed_times_out(cert_manager, tmp_path, capsys) -> None:
    cert_manager.verdict = "never"
    assert _run(cert_manager, tmp_path, "--timeout=1.5") == 1
    assert "not signed within 1.5 s" in capsys.readouterr().err
    assert len(cert_manager.deleted) == 1


def test_an_unreachable_api_server_fails_cleanly(tmp_path, capsys) -> None:
    fake = CertManager(make_node())
    fake.port = 1  # nothing listens there
    assert _run(fake, tmp_path, "--timeout=1") == 1
    assert "gpuagent mqtt-identity:" in capsys.readouterr().err
