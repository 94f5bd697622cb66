"""deploy/kubernetes: the DaemonSet's base, its components, the ready sets of overlays and
every kustomization docs/kubernetes.md shows, checked offline.

Each is rendered by `kubectl kustomize` (kustomize itself: components, generators merged
into the base's ConfigMap, patches, hash suffixes), and every core resource is validated
against the Kubernetes OpenAPI schema shipped in kubernetes-validate, strictly (an unknown
field is an error). The agent's configuration is what the pod reads: the image's
config.toml with the ConfigMap's fragments as config.d. The Prometheus Operator's
ServiceMonitor and PrometheusRule are custom resources outside that schema: their structure
is checked here, and the PrometheusRule must be what scripts/render-prometheusrule makes of
deploy/prometheus/gpuagent-rules.yml.
"""

from __future__ import annotations

import atexit
import copy
import functools
import re
import shutil
import subprocess
import tempfile
import textwrap
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from conftest import REPO, require, run_cli
from gpuagent.cli import _with_node_name
from gpuagent.config import Config, load_config
from gpuagent.deploy import prometheusrule

KUBE = REPO / "deploy" / "kubernetes"
BASE = KUBE / "base"
COMPONENTS = sorted(p.parent for p in (KUBE / "components").glob("*/kustomization.yaml"))
OVERLAYS = sorted(p.parent for p in (KUBE / "overlays").glob("*/kustomization.yaml"))
FLEET = KUBE / "fleet"
# The image's own configuration: the DaemonSet's --config, with the ConfigMap as config.d.
IMAGE_CONFIG = KUBE / "image" / "config.toml"
DOCS = REPO / "docs" / "kubernetes.md"
# The oldest Kubernetes these manifests are for, and the newest schema shipped.
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
CUSTOM = {"ServiceMonitor", "PrometheusRule", "Issuer", "Certificate"}
# Where workloads name a ConfigMap that a generator made (its name gets a hash suffix).
WORKLOADS = {"DaemonSet", "Deployment", "StatefulSet"}
# hostPath types that never make what the node lacks (the OrCreate ones would).
EXISTING = {"Directory", "File", "Socket", "CharDevice", "BlockDevice"}


# --- the kustomizations docs/kubernetes.md shows --------------------------------------------


def _doc_files() -> dict[str, str]:
    """Each code block of the docs whose first line is a comment naming the file it is,
    relative to a directory beside the checkout (`# mine/kustomization.yaml`)."""
    files = {}
    fence = re.compile(r"^[ ]*```\w*\n(.*?)^[ ]*```", re.MULTILINE | re.DOTALL)
    blocks = fence.findall(DOCS.read_text())
    for block in blocks:
        first, _, body = textwrap.dedent(block).partition("\n")
        named = re.fullmatch(r"# ([\w.-]+/[\w.-]+)", first.strip())
        if named:
            files[named[1]] = body
    return files


DOC_FILES = _doc_files()
DOC_SETS = sorted(name.split("/")[0] for name in DOC_FILES if name.endswith("/kustomization.yaml"))


@functools.cache
def _doc_root() -> Path:
    """The docs' kustomizations written out, beside `deploy` as the docs have them."""
    root = Path(tempfile.mkdtemp(prefix="gpuagent-kustomize-docs-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    (root / "deploy").symlink_to(REPO / "deploy")
    for name, text in DOC_FILES.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text(text)
    return root


def doc_set(name: str) -> Path:
    return _doc_root() / name


# The agent's trees (a DaemonSet each), and the fleet's (broker and aggregators).
FLEET_SETS = [
    Path("docs") / name
    for name in DOC_SETS
    if "deploy/kubernetes/fleet" in DOC_FILES[f"{name}/kustomization.yaml"]
]
TREES = [
    BASE,
    *OVERLAYS,
    *[Path("docs") / n for n in DOC_SETS if Path("docs") / n not in FLEET_SETS],
]
ALL_TREES = [*TREES, FLEET, *FLEET_SETS]
# What deploy/kubernetes ships, without the docs' kustomizations (which set images).
SHIPPED = [BASE, *OVERLAYS, FLEET]


def _resolve(tree: Path) -> Path:
    return doc_set(tree.name) if tree.parts[0] == "docs" else tree


# --- kustomize ------------------------------------------------------------------------------


def build(tree: Path) -> list[dict[str, Any]]:
    """What `kubectl kustomize tree` prints."""
    kubectl = require("kubectl", "kubectl renders the kustomizations (kubectl kustomize)")
    result = subprocess.run(
        [kubectl, "kustomize", str(_resolve(tree))],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, f"kubectl kustomize {tree}: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


def rendered(tree: Path) -> list[dict[str, Any]]:
    return copy.deepcopy(_RENDERED.setdefault(tree, build(tree)))


_RENDERED: dict[Path, list[dict[str, Any]]] = {}


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def fragments(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The agent's config.d: the data of the ConfigMap its DaemonSet mounts there."""
    [volume] = [v for v in pod_spec(docs)["volumes"] if v["name"] == "config"]
    data: dict[str, str] = _named(docs, "ConfigMap", volume["configMap"]["name"])["data"]
    return data


def config_dir(docs: list[dict[str, Any]], root: Path) -> Path:
    """The pod's /etc/gpuagent under ``root``: the image's config.toml and the fragments."""
    (root / "config.d").mkdir(parents=True)
    shutil.copy(IMAGE_CONFIG, root / "config.toml")
    for name, text in fragments(docs).items():
        (root / "config.d" / name).write_text(text)
    return root / "config.toml"


def config_of(docs: list[dict[str, Any]]) -> Config:
    """The configuration the agent in the pod loads."""
    with tempfile.TemporaryDirectory() as root:
        return load_config(config_dir(docs, Path(root)))


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (main,) = pod_spec(docs)["containers"]
    return dict(main)


def tree_id(tree: Path) -> str:
    return str(tree) if tree.parts[0] == "docs" else str(tree.relative_to(KUBE))


def _has_component(docs: list[dict[str, Any]], name: str) -> bool:
    return f"50-{name}.toml" in fragments(docs)


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
    for path in KUBE.rglob("kustomization.yaml"):
        tree, kustomization = path.parent, yaml.safe_load(path.read_text())
        listed.add(path.resolve())
        listed |= {(tree / r).resolve() for r in kustomization.get("resources", [])}
        patches = kustomization.get("patches", [])
        listed |= {(tree / p["path"]).resolve() for p in patches if "path" in p}
        generators = kustomization.get("configMapGenerator", [])
        # A file is `path` or `key=path`.
        listed |= {(tree / f.split("=")[-1]).resolve() for g in generators for f in g["files"]}
    files = {
        p.resolve()
        for pattern in ("*.yaml", "*.toml")
        for p in KUBE.rglob(pattern)
        if "image" not in p.parts
    }
    assert files - listed == set()


@pytest.mark.parametrize("tree", ALL_TREES, ids=tree_id)
def test_no_host_path_is_made_where_the_node_lacks_it(tree: Path) -> None:
    for doc in rendered(tree):
        if doc["kind"] in WORKLOADS:
            for volume in doc["spec"]["template"]["spec"].get("volumes", []):
                if "hostPath" in volume:
                    assert volume["hostPath"].get("type") in EXISTING, (tree, volume)


# --- configuration and image, each from one place ---------------------------------------


def _copy_tree(tmp_path: Path) -> Path:
    """deploy/kubernetes copied, for a test that changes a file of it."""
    copy_root = tmp_path / "kubernetes"
    shutil.copytree(KUBE, copy_root)
    return copy_root


def _copy_tree(tmp_path: Path) -> Path:
    """deploy/kubernetes copied, for a test that changes a file of it."""
    copy_root = tmp_path / "kubernetes"
    shutil.copytree(KUBE, copy_root)
    return copy_root


@pytest.mark.parametrize(
    "fragment", ["base/00-base.toml", "components/kernel-log/50-kernel-log.toml"]
)
def test_a_configuration_change_rolls_the_daemonset(fragment: str, tmp_path: Path) -> None:
    tree = KUBE / "overlays" / "kernel-log"
    docs = rendered(tree)
    [volume] = [v for v in pod_spec(docs)["volumes"] if v["name"] == "config"]
    name = volume["configMap"]["name"]
    assert re.fullmatch(r"gpuagent-config-[0-9a-z]{10}", name)
    # A change in any fragment is another name: the DaemonSet's pod template changes.
    copy_root = _copy_tree(tmp_path)
    changed = copy_root / fragment
    changed.write_text(changed.read_text() + "\n# changed\n")
    again = build(copy_root / tree.relative_to(KUBE))
    [volume] = [v for v in pod_spec(again)["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] != name
    assert "# changed" in fragments(again)[PurePosixPath(fragment).name]


@pytest.mark.parametrize("tree", TREES, ids=tree_id)
def test_the_agent_accepts_the_configuration_it_is_given(tree: Path, tmp_path: Path) -> None:
    """`gpuagent config check` on the pod's /etc/gpuagent: the image's file and config.d."""
    docs = rendered(tree)
    path = config_dir(docs, tmp_path / "etc-gpuagent")
    container_args = container(docs)["args"]
    assert f"--config={PurePosixPath('/etc/gpuagent/config.toml')}" in container_args
    [mount] = [m for m in container(docs)["volumeMounts"] if m["name"] == "config"]
    assert mount["mountPath"] == "/etc/gpuagent/config.d"
    result = run_cli("config", "check", str(path))
    assert result.returncode == 0, result.stderr


def test_components_set_no_key_another_sets() -> None:
    """Components combine in any order: no two fragments set the same key."""

    def keys(table: dict[str, Any], prefix: str = "") -> set[str]:
        found = set()
        for key, value in table.items():
            if isinstance(value, dict):
                found |= keys(value, f"{prefix}{key}.")
            else:
                found.add(f"{prefix}{key}")
        return found

    owner: dict[str, Path] = {}
    for fragment in sorted((KUBE / "components").glob("*/*.toml")):
        assert fragment.name.startswith("50-"), fragment
        for key in keys(tomllib.loads(fragment.read_text())):
            assert key not in owner, f"{key}: {owner.get(key)} and {fragment}"
            owner[key] = fragment


def test_every_gpuagent_image_is_the_one_the_version_names() -> None:
    version = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert version is not None
    for tree in SHIPPED:
        for image in _images(rendered(tree)):
            if "gpuagent" in image:
                assert image == f"localhost/gpuagent:{version[1]}", tree


def test_one_images_entry_moves_every_gpuagent_container(tmp_path: Path) -> None:
    """What docs/kubernetes.md tells an operator to write, for a registry of their own."""
    (tmp_path / "deploy").symlink_to(REPO / "deploy")  # kustomize takes relative paths only
    for tree in SHIPPED:
        mine = tmp_path / tree_id(tree).replace("/", "-")
        mine.mkdir()
        (mine / "kustomization.yaml").write_text(
            f"resources:\n  - ../deploy/kubernetes/{tree_id(tree)}\n"
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
    # Only the kernel-log component makes the pod privileged, and only it follows /dev/kmsg.
    privileged = _has_component(docs, "kernel-log")
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
    ]
    # DKMS is read only where the component dkms mounts it; elsewhere the key names the
    # image's own path, which is absent (no DKMS builds).
    if _has_component(docs, "dkms"):
        read.append(config.inventory.dkms_root)
    else:
        assert not _mounted(docs, config.inventory.dkms_root)
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
    # The drop-in is dcgm-exporter's port and labels (pod, namespace, container).
    drop_in = _has_component(docs, "dcgm-exporter-drop-in")
    assert (port == 9400) is drop_in
    assert config_of(docs).attribution.kubernetes is drop_in


def test_the_service_selects_the_daemonsets_pods() -> None:
    docs = rendered(BASE)
    selector = one(docs, "Service")["spec"]["selector"]
    daemonset = one(docs, "DaemonSet")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


# --- RBAC -------------------------------------------------------------------------------------


def _roles(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] == "ClusterRole"}


def test_rbac_is_what_the_agent_uses_and_matches_the_docs() -> None:
    docs = rendered(BASE)
    # The output's conditions and the check (nodes, nodes/status), the output's events
    # (create, then patch to count on them); the requests the tests see are these.
    base = {
        "gpuagent-node": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        ]
    }
    assert _roles(docs) == base
    assert config_of(docs).remediation.cordon.backends == []
    account = one(docs, "ServiceAccount")
    for binding in (d for d in build(doc_set("cordon")) if d["kind"] == "ClusterRoleBinding"):
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": account["metadata"]["name"],
                "namespace": account["metadata"]["namespace"],
            }
        ]
    assert pod_spec(docs)["serviceAccountName"] == account["metadata"]["name"]
    # The cordon backend adds patching the Node, and only that.
    cordon = build(doc_set("cordon"))
    assert config_of(cordon).remediation.cordon.backends == ["kubernetes"]
    roles = _roles(cordon)
    assert roles == {
        **base,
        "gpuagent-node-cordon": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}],
    }
    bindings = {d["roleRef"]["name"] for d in cordon if d["kind"] == "ClusterRoleBinding"}
    assert bindings == set(roles)
    assert _roles(_load(REPO / "docs" / "kubernetes-rbac.yaml")) == roles


# --- Prometheus Operator resources ------------------------------------------------------------


def test_servicemonitor_scrapes_the_service() -> None:
    docs = rendered(KUBE / "overlays" / "with-prometheus-operator")
    assert docs == rendered(Path("docs") / "prometheus")
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


def test_the_release_label_is_one_setting(tmp_path: Path) -> None:
    """kube-prometheus-stack's selectors: the default release, and another in one patch."""
    for tree, release in (
        (KUBE / "overlays" / "with-prometheus-operator", "kube-prometheus-stack"),
        (Path("docs") / "prometheus-release", "prometheus"),
    ):
        docs = rendered(tree)
        for kind in ("ServiceMonitor", "PrometheusRule"):
            assert one(docs, kind)["metadata"]["labels"]["release"] == release, (tree, kind)
        others = [d for d in docs if d["kind"] not in {"ServiceMonitor", "PrometheusRule"}]
        assert all("release" not in d["metadata"].get("labels", {}) for d in others)


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
