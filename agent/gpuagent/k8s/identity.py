"""`gpuagent mqtt-identity`: a node's MQTT client certificate from cert-manager, with the
node's name as its CN (the broker's ACL lets a client publish only under its CN).

Run as the DaemonSet's init container: the key is made here and never leaves the pod; a
cert-manager CertificateRequest carries the CSR to the issuer; the signed certificate and
the issuer's CA are written next to the key, and the request is deleted. cert-manager's
csi-driver cannot put the node's name in a certificate, hence this step. See
docs/kubernetes.md ("The fleet on Kubernetes").
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from gpuagent.fleet.pki import csr_pem, key_pem, new_key, write_file
from gpuagent.k8s.client import KubernetesConfigError, load_api_client

GROUP, VERSION, PLURAL = "cert-manager.io", "v1", "certificaterequests"
_POLL_SECONDS = 1.0


class IdentityError(RuntimeError):
    """No certificate: the message says why."""


def certificate_request(
    node: str, csr_pem: bytes, issuer: str, issuer_kind: str, duration_hours: int
) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CertificateRequest",
        "metadata": {
            # The node's name is in the CSR; a label could not hold every name (63 chars).
            "generateName": f"gpuagent-mqtt-{node[:200]}-",
            "labels": {"app.kubernetes.io/name": "gpuagent"},
        },
        "spec": {
            "request": base64.b64encode(csr_pem).decode(),
            "issuerRef": {"name": issuer, "kind": issuer_kind, "group": GROUP},
            "usages": ["client auth", "digital signature"],
            "duration": f"{duration_hours}h",
        },
    }


def signed(request: dict[str, Any]) -> tuple[bytes, bytes] | None:
    """(certificate, CA) once the request is Ready; None while pending; IdentityError when
    cert-manager denied it or the issuer failed it."""
    status = request.get("status") or {}
    for condition in status.get("conditions") or []:
        kind, state = condition.get("type"), condition.get("status")
        why = f"{condition.get('reason', '')}: {condition.get('message', '')}"
        if kind == "Denied" and state == "True":
            raise IdentityError(f"the certificate request was denied ({why})")
        if kind == "InvalidRequest" and state == "True":
            raise IdentityError(f"the certificate request is invalid ({why})")
        if kind == "Ready" and state == "False" and condition.get("reason") == "Failed":
            raise IdentityError(f"the issuer failed the certificate request ({why})")
        if kind == "Ready" and state == "True" and status.get("certificate"):
            certificate = base64.b64decode(status["certificate"])
            return certificate, base64.b64decode(status.get("ca") or "")
    return None


def obtain(
    api: Any,
    *,
    node: str,
    namespace: str,
    issuer: str,
    issuer_kind: str,
    duration_hours: int,
    timeout: float,
) -> tuple[bytes, bytes, bytes]:
    """(key, certificate, CA) for ``node``, through a CertificateRequest that is deleted
    once answered. ``api`` is a kubernetes CustomObjectsApi."""
    key = new_key()
    csr = csr_pem(key, node)
    body = certificate_request(node, csr, issuer, issuer_kind, duration_hours)
    created = api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    name = created["metadata"]["name"]
    deadline = time.monotonic() + timeout
    try:
        while True:
            request = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            answer = signed(request)
            if answer is not None:
                return key_pem(key), *answer
            if time.monotonic() > deadline:
                raise IdentityError(
                    f"certificate request {namespace}/{name} not signed within {timeout:g} s "
                    f"(is issuer {issuer_kind}/{issuer} ready, and the request approved?)"
                )
            time.sleep(_POLL_SECONDS)
    finally:
        # A request that cannot be deleted (RBAC without delete) is left for an operator;
        # the certificate is what counts.
        with contextlib.suppress(Exception):
            api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def write_identity(directory: Path, key: bytes, certificate: bytes, ca: bytes) -> None:
    """tls.key (0600, written first), tls.crt and ca.crt, each replaced atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    write_file(directory / "tls.key", key, 0o600)
    write_file(directory / "tls.crt", certificate, 0o644)
    if ca:
        write_file(directory / "ca.crt", ca, 0o644)


def run_command(args: argparse.Namespace) -> int:
    from kubernetes.client import ApiException, CustomObjectsApi  # noqa: PLC0415
    from urllib3.exceptions import HTTPError  # noqa: PLC0415

    try:
        client = load_api_client(args.kubeconfig)
        try:
            key, certificate, ca = obtain(
                CustomObjectsApi(client),
                node=args.node_name,
                namespace=args.namespace,
                issuer=args.issuer,
                issuer_kind=args.issuer_kind,
                duration_hours=args.duration_hours,
                timeout=args.timeout,
            )
        finally:
            client.close()  # type: ignore[no-untyped-call]
        write_identity(args.dir, key, certificate, ca)
    except (KubernetesConfigError, IdentityError, OSError) as exc:
        print(f"gpuagent mqtt-identity: {exc}", file=sys.stderr)  # noqa: T201 - a CLI
        return 1
    except HTTPError as exc:
        cause = getattr(exc, "reason", None) or exc
        print(f"gpuagent mqtt-identity: cannot reach the Kubernetes API: {cause}", file=sys.stderr)  # noqa: T201
        return 1
    except ApiException as exc:
        reason = f"HTTP {exc.status} {exc.reason}"
        print(f"gpuagent mqtt-identity: Kubernetes API: {reason}", file=sys.stderr)  # noqa: T201
        return 1
    print(f"{args.dir}/tls.crt: CN={args.node_name}, from {args.issuer_kind}/{args.issuer}")  # noqa: T201
    return 0
