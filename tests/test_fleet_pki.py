"""`gpuagent-aggregator pki`: the fleet's CA, the broker's certificate and one per client,
and revocation, down to a real mosquitto refusing a revoked node."""

from __future__ import annotations

import shutil
import stat
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conftest import deadline_in
from gpuagent.aggregator.cli import main
from gpuagent.fleet.pki import Pki, PkiError
from mqtt_broker import Broker, start_on_free_ports
from mqtt_broker import Pki as BrokerPki


def _cli(args: list[str]) -> int:
    """`gpuagent-aggregator ARGS`, its exit status."""
    try:
        return main(args)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def _cn(path: Path) -> str:
    certificate = x509.load_pem_x509_certificate(path.read_bytes())
    return str(certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def _certificate(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_init_makes_a_ca_the_broker_and_the_aggregator(tmp_path: Path, capsys) -> None:
    directory = tmp_path / "pki"
    assert _cli(["pki", "init", "--dir", str(directory), "--broker-name", "mqtt.example",
                 "--broker-name", "10.0.0.5"]) == 0  # fmt: skip
    assert "CA, broker certificate" in capsys.readouterr().out
    ca = _certificate(directory / "ca.crt")
    broker = _certificate(directory / "broker.crt")
    broker.verify_directly_issued_by(ca)
    names = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["mqtt.example"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    usages = broker.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    # The aggregator's client certificate: CN "aggregator", as the shipped ACL names it.
    aggregator = directory / "clients" / "aggregator.crt"
    assert _cn(aggregator) == "aggregator"
    _certificate(aggregator).verify_directly_issued_by(ca)
    for key in ("ca.key", "broker.key", "clients/aggregator.key"):
        assert stat.S_IMODE((directory / key).stat().st_mode) == 0o600, key
    assert list(x509.load_pem_x509_crl((directory / "crl.pem").read_bytes())) == []
    # A second init would replace the CA every client trusts: refused.
    assert _cli(["pki", "init", "--dir", str(directory)]) == 1
    assert "a CA is there already" in capsys.readouterr().err


def test_issue_and_revoke_a_node(tmp_path: Path, capsys) -> None:
    pki = Pki(tmp_path)
    pki.init(["localhost"])
    assert _cli(["pki", "issue", "gpu-node-7", "--dir", str(tmp_path), "--days", "30"]) == 0
    crt, key = pki.client_files("gpu-node-7")
    assert capsys.readouterr().out.split() == [str(crt), str(key)]
    certificate = _certificate(crt)
    assert _cn(crt) == "gpu-node-7"
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    lifetime = certificate.not_valid_after_utc - certificate.not_valid_before_utc
    assert 30 <= lifetime.days <= 31
    # One certificate per name at a time.
    with pytest.raises(PkiError, match="revoke it first"):
        pki.issue("gpu-node-7")
    assert _cli(["pki", "revoke", "gpu-node-7", "--dir", str(tmp_path)]) == 0
    crl = x509.load_pem_x509_crl(pki.crl_file.read_bytes())
    assert [entry.serial_number for entry in crl] == [certificate.serial_number]
    assert crl.is_signature_valid(_certificate(pki.ca_file).public_key())  # type: ignore[arg-type]
    assert not crt.exists()
    assert not key.exists()
    # Issued again (a reinstalled node), and a second revocation keeps the first.
    pki.issue("gpu-node-7")
    again = _certificate(crt).serial_number
    pki.revoke("gpu-node-7")
    crl = x509.load_pem_x509_crl(pki.crl_file.read_bytes())
    assert [entry.serial_number for entry in crl] == [certificate.serial_number, again]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["pki", "issue", "bad/name"], "is not a node name"),
        (["pki", "issue", "gpu-node-1"], "run `pki init` first"),
        (["pki", "revoke", "gpu-node-1"], "run `pki init` first"),
    ],
)
def test_refusals_name_the_problem(tmp_path: Path, capsys, args: list[str], error: str) -> None:
    assert _cli([*args, "--dir", str(tmp_path / "empty")]) == 1
    assert error in capsys.readouterr().err


def test_revoking_a_name_with_no_certificate_is_refused(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    pki.init(["localhost"])
    with pytest.raises(PkiError, match="has no certificate here"):
        pki.revoke("gpu-node-1")


def _connects(broker: Broker, identity: str, files: tuple[Path, Path] | None = None) -> bool:
    """Whether the TLS listener accepts ``identity``'s certificate, or the one in ``files``
    (a successful CONNACK arrives)."""
    crt, key = files or broker.pki.client(identity)
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=identity)
    client.tls_set(ca_certs=str(broker.pki.ca_file), certfile=str(crt), keyfile=str(key))
    accepted: list[bool] = []
    client.on_connect = lambda _c, _u, _f, reason, _p: accepted.append(not reason.is_failure)
    try:
        client.connect("127.0.0.1", broker.tls_port)
    except OSError:
        return False  # the handshake was refused
    deadline = deadline_in(5)
    while not accepted and time.monotonic() < deadline:
        try:
            if client.loop(timeout=0.1) != mqtt.MQTT_ERR_SUCCESS:
                break
        except OSError:
            break
    client.disconnect()
    return accepted == [True]


def test_a_real_broker_refuses_a_revoked_node(tmp_path: Path) -> None:
    from mqtt_broker import mosquitto_path  # noqa: PLC0415

    mosquitto_path()
    pki = BrokerPki.create(tmp_path / "pki")
    root = tmp_path / "broker"
    (root / "pki").mkdir(parents=True)
    for name in ("broker.crt", "broker.key"):
        shutil.copy(pki.root / name, root / "pki" / name)
    broker = start_on_free_ports(root, pki, check_revocation=True)
    try:
        assert _connects(broker, "gpu-node-1")
        assert _connects(broker, "gpu-node-2")
        # The node keeps its copy (a decommissioned or stolen machine).
        kept = tmp_path / "kept"
        kept.mkdir()
        files = tuple(Path(shutil.copy(f, kept)) for f in pki.client("gpu-node-1"))
        Pki(pki.root).revoke("gpu-node-1")
        broker.restart()  # mosquitto reads the CRL when it starts
        assert not _connects(broker, "gpu-node-1", files)  # type: ignore[arg-type]
        assert _connects(broker, "gpu-node-2")
    finally:
        broker.stop()
