"""A kubelet stand-in for tests: a real gRPC server, in the test process, serving the
pod-resources v1 API (the agent's generated stubs) on a unix socket."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpuagent.attribution.podresources import api_pb2, api_pb2_grpc

# (pod, namespace, container, resource name, device ids)
Allocation = tuple[str, str, str, str, tuple[str, ...]]


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 - the RPC's name
        self._kubelet.calls += 1
        if self._kubelet.failing:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")
        return self._kubelet.response()


class FakeKubelet:
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.allocations: list[Allocation] = []
        self.failing = False
        self.calls = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), self._server)
        self._server.add_insecure_port(f"unix://{socket}")

    def start(self) -> FakeKubelet:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait()

    def response(self) -> api_pb2.ListPodResourcesResponse:
        """The allocations as the kubelet sends them: containers grouped by pod."""
        pods: dict[tuple[str, str], api_pb2.PodResources] = {}
        for pod, namespace, container, resource, device_ids in self.allocations:
            entry = pods.setdefault(
                (namespace, pod), api_pb2.PodResources(name=pod, namespace=namespace)
            )
            entry.containers.append(
                api_pb2.ContainerResources(
                    name=container,
                    devices=[
                        api_pb2.ContainerDevices(
                            resource_name=resource,
                            device_ids=list(device_ids),
                            topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=0)]),
                        )
                    ],
                    cpu_ids=[2, 3],
                )
            )
        return api_pb2.ListPodResourcesResponse(pod_resources=list(pods.values()))
