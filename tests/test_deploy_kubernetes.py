"""deploy/kubernetes: the DaemonSet's base and overlays, checked offline.

Each kustomization is rendered here (resources, namespace, labels, the two kinds of patch
these overlays use, ConfigMap generators with a hash suffix, and image overrides;
any other kustomize feature fails the test rather than being ignored)
and every core resource is validated against the Kubernetes OpenAPI schema shipped in
kubernetes-validate, strictly (an unknown field is an error). The Prometheus Operator's
ServiceMonitor and PrometheusRule are custom resources outside that schema: their structure
is checked here, and the PrometheusRule must be what scripts/render-prometheusrule makes of
deploy/prometheus/gpuagent-rules.yml.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from conftest import REPO
from gpuagent.cli import _with_node_name
from gpuagent.config import Config
from gpuagent.config.loader import parse_config
from gpuagent.deploy import prometheusrule

KUBE = REPO / "deploy" / "kubernetes"
BASE = KUBE / "base"
OVERLAYS = sorted(p.parent for p in (KUBE / "overlays").glob("*/kustomization.yaml"))
# The agent's trees (a DaemonSet each), and the fleet's (broker and aggregators).
TREES = [BASE, *OVERLAYS]
FLEET = KUBE / "fleet"
ALL_TREES = [*TREES, FLEET]
# The oldest Kubernetes these manifests are for, and the newest schema shipped.
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
CUSTOM = {"ServiceMonitor", "PrometheusRule", "Issuer", "Certificate"}
KUSTOMIZATION_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "labels",
    "resources",
    "patches",
    "configMapGenerator",
    "images",
}
# Where workloads name a ConfigMap that a generator made (its name gets a hash suffix).
WORKLOADS = {"DaemonSet", "Deployment", "StatefulSet"}


# --- a small kustomize: what these kustomizations use, nothing more ------------------------


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _pointer(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]


def _json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """RFC 6902 add, replace and remove; a path that does not exist fails, as in kustomize."""
    for op in ops:
        *parents, last = _pointer(op["path"])
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if op["op"] == "replace":
            if isinstance(node, list):
                node[int(last)] = op["value"]
            else:
                assert last in node, f"replace of a missing {op['path']}"
                node[last] = op["value"]
        elif op["op"] == "add":
            if isinstance(node, list):
                node.insert(len(node) if last == "-" else int(last), op["value"])
            else:
                node[last] = op["value"]
        elif op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        else:
            pytest.fail(f"JSON patch op {op['op']!r} is not handled here")


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """A strategic merge patch of maps only (lists would need their merge keys)."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            assert not isinstance(value, list), f"list {key!r} in a merge patch: not handled"
            target[key] = value


def _same(doc: dict[str, Any], kind: str, name: str) -> bool:
    return bool(doc["kind"] == kind and doc["metadata"]["name"] == name)


def _generate(tree: Path, docs: list[dict[str, Any]], generators: list[dict[str, Any]]) -> None:
    """configMapGenerator: a ConfigMap of the files (marked for the name hash), created, or
    replacing the one a base generated."""
    for generator in generators:
        assert set(generator) <= {"name", "files", "behavior"}, f"{tree}: {generator}"
        data = {PurePosixPath(f).name: (tree / f).read_text() for f in generator["files"]}
        made = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": generator["name"]},
            "data": data,
            "__generated__": True,
        }
        matches = [d for d in docs if _same(d, "ConfigMap", generator["name"])]
        if generator.get("behavior", "create") == "replace":
            assert len(matches) == 1, f"{tree}: replace of a ConfigMap no base generated"
            docs[docs.index(matches[0])] = made
        else:
            assert not matches, f"{tree}: {generator['name']} generated twice"
            docs.append(made)


def content_hash(config_map: dict[str, Any]) -> str:
    """A suffix that changes with the ConfigMap's name and data, as kustomize's does (its
    digits are kustomize's own: only what the name follows matters here)."""
    content = json.dumps([config_map["metadata"]["name"], config_map["data"]], sort_keys=True)
    return hashlib.sha256(content.encode()).hexdigest()[:10]


def _suffix_generated_names(docs: list[dict[str, Any]]) -> None:
    """The generated ConfigMaps get their hash suffix, and the workloads' volumes follow."""
    renamed = {}
    for doc in docs:
        if doc.pop("__generated__", False):
            name = doc["metadata"]["name"]
            renamed[name] = f"{name}-{content_hash(doc)}"
            doc["metadata"]["name"] = renamed[name]
    for doc in docs:
        if doc["kind"] in WORKLOADS:
            for volume in doc["spec"]["template"]["spec"].get("volumes", []):
                config_map = volume.get("configMap")
                if config_map and config_map["name"] in renamed:
                    config_map["name"] = renamed[config_map["name"]]


def _set_images(docs: list[dict[str, Any]], images: list[dict[str, str]]) -> None:
    """images: a container image named ``name`` (any tag) becomes newName:newTag."""
    for doc in docs:
        if doc["kind"] not in WORKLOADS:
            continue
        pod = doc["spec"]["template"]["spec"]
        for box in [*pod.get("initContainers", []), *pod["containers"]]:
            name, _, tag = box["image"].rpartition(":")
            for image in images:
                assert set(image) <= {"name", "newName", "newTag"}, image
                if name == image["name"]:
                    box["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"


def render(tree: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((tree / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KUSTOMIZATION_KEYS
    assert not unknown, f"{tree}: kustomization keys this test does not render: {unknown}"
    docs: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = tree / entry
        docs += render(path) if path.is_dir() else _load(path)
    _generate(tree, docs, kustomization.get("configMapGenerator", []))
    for patch in kustomization.get("patches", []):
        if "path" in patch:
            (body,) = _load(tree / patch["path"])
            matches = [d for d in docs if _same(d, body["kind"], body["metadata"]["name"])]
            assert len(matches) == 1, f"{tree}: {patch['path']} patches nothing"
            _merge(matches[0], body)
        else:
            target = patch["target"]
            matches = [d for d in docs if _same(d, target["kind"], target["name"])]
            assert len(matches) == 1, f"{tree}: patch for {target} matches nothing"
            _json_patch(matches[0], yaml.safe_load(patch["patch"]))
    for doc in docs:
        metadata = doc.setdefault("metadata", {})
        if "namespace" in kustomization and doc["kind"] not in CLUSTER_SCOPED:
            metadata["namespace"] = kustomization["namespace"]
        for label_set in kustomization.get("labels", []):
            metadata.setdefault("labels", {}).update(label_set["pairs"])
            if label_set.get("includeSelectors"):
                pytest.fail("labels with includeSelectors are not rendered here")
    _set_images(docs, kustomization.get("images", []))
    return docs


def build(tree: Path) -> list[dict[str, Any]]:
    """What `kubectl kustomize tree` prints: render, then the generated names."""
    docs = render(tree)
    _suffix_generated_names(docs)
    return docs


def rendered(tree: Path) -> list[dict[str, Any]]:
    return copy.deepcopy(_RENDERED.setdefault(tree, build(tree)))


_RENDERED: dict[Path, list[dict[str, Any]]] = {}


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def config_of(docs: list[dict[str, Any]]) -> Config:
    return parse_config(one(docs, "ConfigMap")["data"]["config.toml"])


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (main,) = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return dict(main)


def tree_id(tree: Path) -> str:
    return str(tree.relative_to(KUBE))


# --- schema ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("tree", ALL_TREES, ids=tree_id)
def test_every_resource_validates_against_the_openapi_schema(tree: Path, version: str) -> None:
    docs = rendered(tree)
    assert docs
    for doc in docs:
        if doc["kind"] in CUSTOM:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{tree_id(tree)}: {doc['kind']}/{doc['metadata']['name']}: {exc}")


def test_the_validator_rejects_an_unknown_field_and_a_wrong_type() -> None:
    daemonset = one(rendered(BASE), "DaemonSet")
    misspelt = copy.deepcopy(daemonset)
    misspelt["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="hostPid"):
        kubernetes_validate.validate(misspelt, VERSIONS[-1], strict=True)
    wrong_type = copy.deepcopy(daemonset)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, VERSIONS[-1], strict=True)


def test_every_file_in_the_tree_is_used() -> None:
    listed: set[Path] = set()
    for tree in ALL_TREES:
        kustomization = yaml.safe_load((tree / "kustomization.yaml").read_text())
        listed.add((tree / "kustomization.yaml").resolve())
        listed |= {(tree / r).resolve() for r in kustomization.get("resources", [])}
        patches = kustomization.get("patches", [])
        listed |= {(tree / p["path"]).resolve() for p in patches if "path" in p}
        generators = kustomization.get("configMapGenerator", [])
        listed |= {(tree / f).resolve() for g in generators for f in g["files"]}
    files = {
        p.resolve()
        for pattern in ("*.yaml", "*.toml")
        for p in KUBE.rglob(pattern)
        if "image" not in p.parts
    }
    assert files - listed == set()


# --- configuration and image, each from one place ---------------------------------------


def _copy_tree(tmp_path: Path) -> Path:
    """deploy/kubernetes copied, for a test that changes a file of it."""
    copy_root = tmp_path / "kubernetes"
    shutil.copytree(KUBE, copy_root)
    return copy_root


@pytest.mark.parametrize("tree", TREES, ids=tree_id)
def test_a_configuration_change_rolls_the_daemonset(tree: Path, tmp_path: Path) -> None:
    docs = rendered(tree)
    config_map = one(docs, "ConfigMap")
    name = config_map["metadata"]["name"]
    assert re.fullmatch(r"gpuagent-config-[0-9a-z]{10}", name)
    [volume] = [v for v in pod_spec(docs)["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == name
    # Another configuration is another name: the DaemonSet's pod template changes.
    copy_root = _copy_tree(tmp_path)
    changed = copy_root / tree.relative_to(KUBE)
    toml = next(p for p in (changed, copy_root / "base") if (p / "config.toml").exists())
    (toml / "config.toml").write_text((toml / "config.toml").read_text() + "\n# changed\n")
    again = build(changed)
    assert one(again, "ConfigMap")["metadata"]["name"] != name
    [volume] = [v for v in pod_spec(again)["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == one(again, "ConfigMap")["metadata"]["name"]


def test_every_gpuagent_image_is_the_one_the_version_names() -> None:
    version = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert version is not None
    for tree in TREES:
        for image in _images(rendered(tree)):
            if "gpuagent" in image:
                assert image == f"localhost/gpuagent:{version[1]}", tree


def test_one_images_entry_moves_every_gpuagent_container(tmp_path: Path) -> None:
    """What docs/kubernetes.md tells an operator to write, for a registry of their own."""
    for tree in TREES:
        mine = tmp_path / tree.name
        mine.mkdir()
        (mine / "kustomization.yaml").write_text(
            f"resources:\n  - {tree}\n"
            "images:\n  - name: localhost/gpuagent\n"
            "    newName: registry.example.org/gpu/gpuagent\n    newTag: 0.1.0-1\n"
        )
        images = _images(build(mine))
        ours = [i for i in images if "gpuagent" in i]
        assert ours, tree
        assert set(ours) == {"registry.example.org/gpu/gpuagent:0.1.0-1"}, tree


def _images(docs: list[dict[str, Any]]) -> list[str]:
    images = []
    for doc in docs:
        if doc["kind"] in WORKLOADS:
            pod = doc["spec"]["template"]["spec"]
            images += [c["image"] for c in [*pod.get("initContainers", []), *pod["containers"]]]
    return images


# --- the DaemonSet ------------------------------------------------------------------------


def test_the_node_name_comes_from_the_downward_api() -> None:
    main = container(rendered(BASE))
    env = {e["name"]: e for e in main["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "--node-name=$(NODE_NAME)" in main["args"]
    assert config_of(rendered(BASE)).agent.node_name == ""


def test_the_shipped_agent_writes_conditions_and_events_in_observe_mode() -> None:
    config = config_of(rendered(BASE))
    assert config.remediation.mode == "observe"
    output = config.outputs.kubernetes
    assert output.enabled
    # The in-cluster service account, and the Node this pod runs on (--node-name).
    assert (output.kubeconfig, output.node_name) == ("", "")
    assert config.remediation.cordon.kubernetes.node_name == ""


def test_node_name_option_sets_agent_node_name_and_is_checked() -> None:
    config = _with_node_name(Config(), "gpu-node-07")
    assert config.agent.node_name == "gpu-node-07"
    assert _with_node_name(config, None) is config
    with pytest.raises(SystemExit) as exited:
        _with_node_name(Config(), "not a name")
    assert exited.value.code == 2


def _unit_capabilities() -> set[str]:
    unit = (REPO / "systemd" / "gpuagent.service").read_text()
    (line,) = re.findall(r"^CapabilityBoundingSet=(.*)$", unit, re.MULTILINE)
    return {cap.removeprefix("CAP_") for cap in line.split()}


@pytest.mark.parametrize("tree", TREES, ids=tree_id)
def test_the_pod_gets_no_more_than_the_systemd_unit(tree: Path) -> None:
    docs = rendered(tree)
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    security = container(docs)["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(security["capabilities"]["add"]) <= _unit_capabilities()
    assert security["readOnlyRootFilesystem"] is True
    assert pod["hostPID"] is True
    # Only the kernel-log overlay is privileged, and only it follows /dev/kmsg.
    privileged = tree.name == "kernel-log"
    assert security["privileged"] is privileged
    assert config_of(docs).sources.kmsg.enabled is privileged


def test_the_pod_tolerates_its_own_cordon_taint() -> None:
    docs = rendered(BASE)
    taint = config_of(docs).remediation.cordon.kubernetes.taint_key
    tolerations = one(docs, "DaemonSet")["spec"]["template"]["spec"]["tolerations"]
    assert {"key": taint, "operator": "Exists", "effect": "NoSchedule"} in tolerations


def _mounted(docs: list[dict[str, Any]], path: Path, *, writable: bool = False) -> bool:
    for mount in container(docs)["volumeMounts"]:
        if PurePosixPath(path).is_relative_to(mount["mountPath"]):
            return not (writable and mount.get("readOnly", False))
    return False


@pytest.mark.parametrize("tree", TREES, ids=tree_id)
def test_every_path_the_configuration_reads_is_mounted(tree: Path) -> None:
    docs = rendered(tree)
    config = config_of(docs)
    read = [
        *config.checks.kubernetes.cdi_dirs,
        *config.checks.kubernetes.runtime_paths,
        *config.checks.kubernetes.containerd_configs,
        config.checks.kubernetes.device_plugin_dir,
        config.attribution.pod_resources_socket,
        config.inventory.os_release,
        config.inventory.modules_root,
        config.inventory.dkms_root,
    ]
    broker = config.outputs.mqtt.broker
    if config.outputs.mqtt.enabled:
        read += [broker.ca_file, broker.cert_file, broker.key_file]
    for path in read:
        assert _mounted(docs, Path(path)), f"{path} is not mounted"
    for path in (config.agent.state_dir, config.api.socket, config.remediation.kill_switch):
        assert _mounted(docs, Path(path), writable=True), f"{path} is not writable"
    volumes = {v["name"] for v in one(docs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    assert {m["name"] for m in container(docs)["volumeMounts"]} == volumes


@pytest.mark.parametrize("tree", TREES, ids=tree_id)
def test_ports_agree_with_metrics_listen(tree: Path) -> None:
    docs = rendered(tree)
    _, port = config_of(docs).metrics.host_port
    (container_port,) = container(docs)["ports"]
    assert container_port == {"name": "metrics", "containerPort": port, "protocol": "TCP"}
    (service_port,) = one(docs, "Service")["spec"]["ports"]
    assert service_port["port"] == port
    assert service_port["targetPort"] == "metrics"
    assert tree.name != "drop-in-dcgm-exporter" or port == 9400


def test_the_service_selects_the_daemonsets_pods() -> None:
    docs = rendered(BASE)
    selector = one(docs, "Service")["spec"]["selector"]
    daemonset = one(docs, "DaemonSet")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


@pytest.mark.parametrize("tree", OVERLAYS, ids=tree_id)
def test_overlay_configurations_differ_from_the_base_only_where_they_say(tree: Path) -> None:
    """An overlay replaces the whole config.toml; everything but its own change must stay
    as in the base (so a base change is not silently lost in an overlay)."""
    base = config_of(rendered(BASE))
    overlay = config_of(rendered(tree))
    if tree.name == "drop-in-dcgm-exporter":
        assert overlay.metrics.listen == ":9400"
        overlay = dataclasses.replace(overlay, metrics=base.metrics)
    elif tree.name == "kernel-log":
        assert overlay.sources.kmsg.path == Path("/dev/kmsg")
        overlay = dataclasses.replace(
            overlay, sources=dataclasses.replace(overlay.sources, kmsg=base.sources.kmsg)
        )
    elif tree.name == "fleet-agent":
        assert overlay.outputs.mqtt.enabled
        overlay = dataclasses.replace(
            overlay, outputs=dataclasses.replace(overlay.outputs, mqtt=base.outputs.mqtt)
        )
    assert overlay == base


# --- RBAC -------------------------------------------------------------------------------------


def test_rbac_is_what_the_agent_uses_and_matches_the_docs() -> None:
    docs = rendered(BASE)
    role = one(docs, "ClusterRole")
    # The cordon backend and the output's conditions (nodes, nodes/status), the output's
    # events (create, then patch to count on them); the requests the tests see are these.
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    binding = one(docs, "ClusterRoleBinding")
    account = one(docs, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    documented = one(_load(REPO / "docs" / "kubernetes-rbac.yaml"), "ClusterRole")
    assert documented["rules"] == role["rules"]


# --- Prometheus Operator resources ------------------------------------------------------------


def test_servicemonitor_scrapes_the_service() -> None:
    docs = rendered(KUBE / "overlays" / "with-prometheus-operator")
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
    labels = monitor["spec"]["selector"]["matchLabels"]
    assert labels.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    port_names = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "relabelings"}
        for relabel in endpoint.get("relabelings", []):
            assert set(relabel) <= {"sourceLabels", "targetLabel", "action", "regex"}


def test_prometheusrule_is_generated_from_the_current_rules_file() -> None:
    committed = (REPO / prometheusrule.OUTPUT).read_text()
    expected = prometheusrule.render((REPO / prometheusrule.RULES).read_text())
    assert committed == expected, (
        f"{prometheusrule.OUTPUT} is stale: run scripts/render-prometheusrule"
    )


def test_prometheusrule_carries_the_rule_groups_unchanged() -> None:
    rule = one(rendered(KUBE / "overlays" / "with-prometheus-operator"), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "gpuagent"
    groups = yaml.safe_load((REPO / prometheusrule.RULES).read_text())["groups"]
    assert rule["spec"] == {"groups": groups}
    for group in rule["spec"]["groups"]:
        for each in group["rules"]:
            assert ("alert" in each) != ("record" in each)
            assert isinstance(each["expr"], str)


def test_render_refuses_a_file_without_rule_groups() -> None:
    with pytest.raises(prometheusrule.RulesError):
        prometheusrule.render("groups: []\n")
    with pytest.raises(prometheusrule.RulesError):
        prometheusrule.render("groups:\n  - rules: []\n")


def test_render_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text("groups:\n  - name: g\n    rules:\n      - record: a\n        expr: b\n")
    output = tmp_path / "rule.yaml"
    assert prometheusrule.main(["--rules", str(rules), "--output", str(output), "--check"]) == 1
    assert prometheusrule.main(["--rules", str(rules), "--output", str(output)]) == 0
    assert prometheusrule.main(["--rules", str(rules), "--output", str(output), "--check"]) == 0
    assert yaml.safe_load(output.read_text())["spec"]["groups"][0]["name"] == "g"
