"""deploy/kubernetes/fleet and overlays/fleet-agent: the broker, the aggregators, their PKI
and the agents that report to them, checked offline against each other (the schema check
of every resource is in test_deploy_kubernetes)."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from conftest import REPO
from gpuagent.config.loader import parse_config
from test_deploy_kubernetes import BASE, FLEET, KUBE, config_of, one, rendered

AGENT = KUBE / "overlays" / "fleet-agent"


def _named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _config_map(docs: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    (doc,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].rsplit("-", 1)[0] == prefix
    ]
    return doc


def _pod(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = _named(docs, kind, name)["spec"]["template"]["spec"]
    return spec


def _mount_of(pod: dict[str, Any], container: str, path: str) -> tuple[dict[str, Any], str]:
    """The volume under ``path`` in ``container``, and the path inside that volume."""
    boxes = [*pod.get("initContainers", []), *pod["containers"]]
    (box,) = [b for b in boxes if b["name"] == container]
    best = max(
        (m for m in box["volumeMounts"] if PurePosixPath(path).is_relative_to(m["mountPath"])),
        key=lambda m: len(m["mountPath"]),
    )
    (volume,) = [v for v in pod["volumes"] if v["name"] == best["name"]]
    return volume, str(PurePosixPath(path).relative_to(best["mountPath"]))


def _broker_conf(docs: list[dict[str, Any]]) -> dict[str, str]:
    data = _config_map(docs, "gpuagent-broker")["data"]
    settings = {}
    for name in ("mosquitto.conf", "gpuagent.conf"):
        for line in data[name].splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.partition(" ")
                settings[key] = value
    return settings


def test_the_broker_runs_the_shipped_configuration() -> None:
    docs = rendered(FLEET)
    data = _config_map(docs, "gpuagent-broker")["data"]
    assert data["gpuagent.conf"] == (REPO / "deploy" / "mosquitto" / "gpuagent.conf").read_text()
    pod = _pod(docs, "StatefulSet", "gpuagent-broker")
    # mosquitto.conf includes the directory where gpuagent.conf is mounted.
    settings = _broker_conf(docs)
    volume, inside = _mount_of(pod, "mosquitto", settings["include_dir"] + "/gpuagent.conf")
    assert {"key": "gpuagent.conf", "path": inside} in volume["configMap"]["items"]
    # Every file the configuration names is mounted from where it is made.
    for key, source, item in (
        ("acl_file", "configMap", "gpuagent.acl"),
        ("cafile", "secret", "ca.crt"),
        ("certfile", "secret", "tls.crt"),
        ("keyfile", "secret", "tls.key"),
    ):
        volume, inside = _mount_of(pod, "mosquitto", settings[key])
        assert {"key": item, "path": inside} in volume[source]["items"], key
    volume_claims = _named(docs, "StatefulSet", "gpuagent-broker")["spec"]["volumeClaimTemplates"]
    data_mount = settings["persistence_location"].rstrip("/")
    assert any(
        m["mountPath"] == data_mount and m["name"] == volume_claims[0]["metadata"]["name"]
        for m in pod["containers"][0]["volumeMounts"]
    )


def test_the_acl_is_the_shipped_one_with_each_aggregator_replica() -> None:
    docs = rendered(FLEET)
    acl = _config_map(docs, "gpuagent-broker")["data"]["gpuagent.acl"]
    shipped = (REPO / "deploy" / "mosquitto" / "gpuagent.acl").read_text()
    aggregators = _named(docs, "StatefulSet", "aggregator")
    names = [f"aggregator-{i}" for i in range(aggregators["spec"]["replicas"])]
    extra = [line for line in acl.splitlines() if line not in shipped.splitlines()]
    users = [line.removeprefix("user ") for line in extra if line.startswith("user ")]
    assert users == names
    # Each gets what the shipped "aggregator" gets, and nothing else is added.
    for name in names:
        block = acl.split(f"user {name}\n", 1)[1].split("\n\n", 1)[0]
        assert block == "topic read gpuagent/v1/#\ntopic write gpuagent/v1/+/+/cmd"
    assert all(line.startswith(("user ", "topic ", "#")) for line in extra if line)


def test_the_aggregators_reach_the_broker_and_their_secrets() -> None:
    docs = rendered(FLEET)
    text = _config_map(docs, "gpuagent-aggregator")["data"]["aggregator.toml"]
    config = parse_config(text).aggregator
    service = _named(docs, "Service", "gpuagent-broker")
    assert config.broker.host == "gpuagent-broker.gpuagent.svc"
    assert config.broker.port == service["spec"]["ports"][0]["port"]
    assert config.database.startswith("postgresql://")
    pod = _pod(docs, "StatefulSet", "aggregator")
    for path, source in (
        (config.broker.ca_file, "emptyDir"),
        (config.broker.cert_file, "emptyDir"),
        (config.broker.key_file, "emptyDir"),
        (config.postgres.password_file, "secret"),
        (config.command_token_file, "secret"),
    ):
        volume, _ = _mount_of(pod, "aggregator", path)
        assert source in volume, path
    # The identity volume is what the init container writes, CN = the pod's name.
    (init,) = pod["initContainers"]
    assert "--node-name=$(POD_NAME)" in init["args"]
    identity_dir = next(a.split("=", 1)[1] for a in init["args"] if a.startswith("--dir="))
    assert PurePosixPath(config.broker.cert_file).parent == PurePosixPath(identity_dir)
    listen_port = int(config.listen.rsplit(":", 1)[1])
    assert pod["containers"][0]["ports"][0]["containerPort"] == listen_port
    # Two replicas, one of which a disruption may take at a time.
    budget = _named(docs, "PodDisruptionBudget", "gpuagent-aggregator")
    labels = _named(docs, "StatefulSet", "aggregator")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["maxUnavailable"] == 1
    assert _named(docs, "StatefulSet", "aggregator")["spec"]["replicas"] == 2


def test_the_agents_report_to_the_fleets_broker_as_their_node() -> None:
    agent, fleet = rendered(AGENT), rendered(FLEET)
    broker = config_of(agent).outputs.mqtt.broker
    assert config_of(agent).outputs.mqtt.enabled
    assert broker.host == "gpuagent-broker.gpuagent.svc"
    assert broker.port == _named(fleet, "Service", "gpuagent-broker")["spec"]["ports"][0]["port"]
    pod = one(agent, "DaemonSet")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert "--node-name=$(NODE_NAME)" in init["args"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in init["env"]}
    assert env == {"NODE_NAME": "spec.nodeName", "POD_NAMESPACE": "metadata.namespace"}
    identity_dir = next(a.split("=", 1)[1] for a in init["args"] if a.startswith("--dir="))
    for path in (broker.ca_file, broker.cert_file, broker.key_file):
        assert PurePosixPath(path).parent == PurePosixPath(identity_dir)
        volume, _ = _mount_of(pod, "gpuagent", path)
        assert volume["emptyDir"]["medium"] == "Memory"
    # The init container asks for nothing: no capability, not root.
    security = init["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True


def test_every_certificate_comes_from_the_fleets_ca_issuer() -> None:
    docs = rendered(FLEET)
    issuers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Issuer"}
    certificates = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    for certificate in certificates.values():
        reference = certificate["spec"]["issuerRef"]
        assert (reference["kind"], reference["group"]) == ("Issuer", "cert-manager.io")
        assert reference["name"] in issuers
    ca_issuer = issuers["gpuagent-ca"]
    assert (
        ca_issuer["spec"]["ca"]["secretName"] == certificates["gpuagent-ca"]["spec"]["secretName"]
    )
    assert certificates["gpuagent-ca"]["spec"]["isCA"] is True
    # The broker's name as the agents and aggregators dial it is in its certificate.
    broker = certificates["gpuagent-broker"]["spec"]
    assert "gpuagent-broker.gpuagent.svc" in broker["dnsNames"]
    assert broker["usages"] == ["server auth", "digital signature"]
    pod = _pod(docs, "StatefulSet", "gpuagent-broker")
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {broker["secretName"]}
    # Agents and aggregators ask the CA issuer for their client certificates.
    for tree, kind, name in (
        (AGENT, "DaemonSet", "gpuagent"),
        (FLEET, "StatefulSet", "aggregator"),
    ):
        (init,) = _pod(rendered(tree), kind, name)["initContainers"]
        assert "--issuer=gpuagent-ca" in init["args"]


def test_identity_rbac_is_what_mqtt_identity_uses() -> None:
    docs = rendered(FLEET)
    role = _named(docs, "Role", "gpuagent-mqtt-identity")
    assert role["rules"] == [
        {
            "apiGroups": ["cert-manager.io"],
            "resources": ["certificaterequests"],
            "verbs": ["create", "get", "delete"],
        }
    ]
    binding = _named(docs, "RoleBinding", "gpuagent-mqtt-identity")
    accounts = {s["name"] for s in binding["subjects"]}
    agent_account = one(rendered(BASE), "ServiceAccount")["metadata"]["name"]
    aggregator_account = _pod(docs, "StatefulSet", "aggregator")["serviceAccountName"]
    assert accounts == {agent_account, aggregator_account}
    assert {s["namespace"] for s in binding["subjects"]} == {"gpuagent"}


def test_the_fleet_runs_in_the_agents_namespace() -> None:
    namespaces = {d["metadata"].get("namespace") for d in rendered(FLEET)}
    assert namespaces == {"gpuagent"}
