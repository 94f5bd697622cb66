"""The kubelet's pod-resources API (v1.PodResourcesLister/List) over its unix socket.

Imported only with `attribution.kubernetes` on: grpc and protobuf are not loaded otherwise.
"""

from __future__ import annotations

import grpc

from gpuagent.attribution.owners import DeviceOwner, device_uuid
from gpuagent.attribution.podresources import api_pb2, api_pb2_grpc


def owners(response: api_pb2.ListPodResourcesResponse) -> tuple[DeviceOwner, ...]:
    """Every GPU or MIG device of every container, once each (replicas folded)."""
    seen: dict[tuple[str, str, str, str], DeviceOwner] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                for device_id in devices.device_ids:
                    uuid = device_uuid(device_id)
                    if not uuid.startswith(("GPU-", "MIG-")):
                        continue  # another plugin's device (an RDMA NIC, an FPGA)
                    key = (uuid, pod.namespace, pod.name, container.name)
                    seen.setdefault(
                        key,
                        DeviceOwner(
                            uuid, pod.name, pod.namespace, container.name, devices.resource_name
                        ),
                    )
    return tuple(seen.values())


class KubeletClient:
    """One channel to the kubelet, kept open: gRPC reconnects it when the kubelet restarts.

    Blocking: called on a worker thread, each call bounded by ``timeout``.
    """

    def __init__(self, socket_path: str, timeout: float) -> None:
        self._timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        # The generated gRPC stub carries no annotations (grpcio-tools writes none for it).
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]

    def list(self) -> tuple[DeviceOwner, ...]:
        response = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout)
        return owners(response)

    def close(self) -> None:
        self._channel.close()
