"""The fleet's MQTT PKI for a small fleet: a CA, the broker's server certificate, and a
client certificate per identity whose CN the broker's ACL matches (a node's name,
"aggregator", "aggregator-<name>"), with revocation by a CRL the broker reads.

`gpuagent-aggregator pki init|issue|revoke` (docs/fleet.md, "Certificates"). The layout of
the directory, all PEM, keys 0600:

    ca.crt ca.key                     the CA (ten years)
    broker.crt broker.key             the broker's server certificate
    clients/NAME.crt clients/NAME.key one per identity (the aggregator's made at init)
    crl.pem                           the revoked client certificates
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuagent.fleet.topics import AGGREGATOR_IDENTITY, NAME_RE

CA_DAYS = 3650
CRL_DAYS = 3650  # the CRL is rewritten on every revocation; its own expiry must not bite
DEFAULT_DAYS = 825


class PkiError(ValueError):
    """The directory or a name cannot be used; the message says why."""


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def csr_pem(key: ec.EllipticCurvePrivateKey, common_name: str) -> bytes:
    """A CSR for ``common_name`` (what cert-manager signs for `gpuagent mqtt-identity`)."""
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(_name(common_name))
        .sign(key, hashes.SHA256())
    )
    return request.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Pki:
    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def crl_file(self) -> Path:
        return self.directory / "crl.pem"

    def client_files(self, name: str) -> tuple[Path, Path]:
        clients = self.directory / "clients"
        return clients / f"{name}.crt", clients / f"{name}.key"

    # --- init, issue, revoke -------------------------------------------------------------

    def init(self, broker_names: list[str], days: int = DEFAULT_DAYS) -> None:
        """A new CA, the broker's certificate for ``broker_names`` (host names or IP
        addresses), the aggregator's client certificate and an empty CRL."""
        if self.ca_file.exists():
            raise PkiError(f"{self.ca_file} exists: a CA is there already")
        if not broker_names:
            raise PkiError("the broker needs at least one name (--broker-name)")
        self.directory.mkdir(parents=True, exist_ok=True)
        ca_key = new_key()
        now = _now()
        ca = (
            _builder(_name("gpuagent MQTT CA"), _name("gpuagent MQTT CA"), ca_key, now, CA_DAYS)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        write_file(self.directory / "ca.key", key_pem(ca_key), 0o600)
        write_file(self.ca_file, _pem(ca), 0o644)
        broker_key = new_key()
        alternative = x509.SubjectAlternativeName([_general_name(n) for n in broker_names])
        broker = (
            _builder(_name(broker_names[0]), ca.subject, broker_key, now, days)
            .add_extension(alternative, critical=False)
            .add_extension(_extended(ExtendedKeyUsageOID.SERVER_AUTH), critical=False)
            .add_extension(_usage(), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        write_file(self.directory / "broker.key", key_pem(broker_key), 0o600)
        write_file(self.directory / "broker.crt", _pem(broker), 0o644)
        self._write_crl(ca, ca_key, [])
        self.issue(AGGREGATOR_IDENTITY, days)

    def issue(self, name: str, days: int = DEFAULT_DAYS) -> tuple[Path, Path]:
        """A client certificate with CN ``name``; refuses a name that has one already
        (revoke it first)."""
        if not NAME_RE.match(name):
            raise PkiError(f"{name!r} is not a node name (letters, digits, '.', '_', '-')")
        ca, ca_key = self._ca()
        crt_file, key_file = self.client_files(name)
        if crt_file.exists():
            raise PkiError(f"{name} has a certificate already ({crt_file}); revoke it first")
        key = new_key()
        certificate = (
            _builder(_name(name), ca.subject, key, _now(), days)
            .add_extension(_extended(ExtendedKeyUsageOID.CLIENT_AUTH), critical=False)
            .add_extension(_usage(), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        crt_file.parent.mkdir(mode=0o755, exist_ok=True)
        write_file(key_file, key_pem(key), 0o600)
        write_file(crt_file, _pem(certificate), 0o644)
        return crt_file, key_file

    def revoke(self, name: str) -> int:
        """Add ``name``'s certificate to the CRL and remove its files, so the name can be
        issued again; returns the revoked serial number."""
        ca, ca_key = self._ca()
        crt_file, key_file = self.client_files(name)
        try:
            certificate = x509.load_pem_x509_certificate(crt_file.read_bytes())
        except FileNotFoundError:
            raise PkiError(f"{name} has no certificate here ({crt_file})") from None
        revoked = [*self._revoked(), certificate.serial_number]
        self._write_crl(ca, ca_key, revoked)
        crt_file.unlink()
        key_file.unlink(missing_ok=True)
        return certificate.serial_number

    # --- the files -------------------------------------------------------------------------

    def _ca(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        try:
            ca = x509.load_pem_x509_certificate(self.ca_file.read_bytes())
            key = serialization.load_pem_private_key((self.directory / "ca.key").read_bytes(), None)
        except FileNotFoundError as exc:
            raise PkiError(f"no CA in {self.directory}: run `pki init` first ({exc})") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise PkiError(f"{self.directory / 'ca.key'} is not an EC key")
        return ca, key

    def _revoked(self) -> list[int]:
        crl = x509.load_pem_x509_crl(self.crl_file.read_bytes())
        return [entry.serial_number for entry in crl]

    def _write_crl(
        self, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, serials: list[int]
    ) -> None:
        now = _now()
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(ca.subject)
            .last_update(now)
            .next_update(now + dt.timedelta(days=CRL_DAYS))
        )
        for serial in serials:
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(now).build()
            )
        crl = builder.sign(ca_key, hashes.SHA256())
        write_file(self.crl_file, crl.public_bytes(serialization.Encoding.PEM), 0o644)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    now: dt.datetime,
    days: int,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # A little in the past: a node whose clock is a few minutes behind still takes it.
        .not_valid_before(now - dt.timedelta(minutes=10))
        .not_valid_after(now + dt.timedelta(days=days))
    )


def _usage(*, cert_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _extended(usage: x509.ObjectIdentifier) -> x509.ExtendedKeyUsage:
    return x509.ExtendedKeyUsage([usage])


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Written whole under a temporary name, then renamed: never half a key."""
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    temporary.chmod(mode)  # whatever the umask
    temporary.replace(path)
