"""RDMA ports in the status document and in `gpuagent status`'s text view."""

from __future__ import annotations

from dataclasses import replace

from gpuagent.model import IbDevice, IbPort
from gpuagent.render import render_status
from gpuagent.statusview import status_document
from test_metrics_support import snapshot

UP = IbPort("mlx5_0", 1, 4, "ACTIVE", 5, "LinkUp", 400.0, "InfiniBand")


def _node(*ports: IbPort) -> tuple[IbDevice, ...]:
    return tuple(IbDevice(p.device, ports=(p,)) for p in ports)


def test_status_document_lists_every_port() -> None:
    doc = status_document(snapshot(infiniband=_node(UP)))
    assert doc["node"]["infiniband"] == [
        {
            "device": "mlx5_0",
            "port": 1,
            "state": "ACTIVE",
            "phys_state": "LinkUp",
            "active": True,
            "rate_gbps": 400.0,
            "link_layer": "InfiniBand",
        }
    ]
    assert status_document(snapshot())["node"]["infiniband"] is None


def test_text_view_summarises_and_names_the_ports_down() -> None:
    slow = replace(UP, device="mlx5_1", rate_gbps=200.0)
    down = IbPort("mlx5_2", 1, 1, "DOWN", 2, "Polling", 2.5, "InfiniBand")
    unread = IbPort("mlx5_3", 1)
    doc = status_document(snapshot(infiniband=_node(UP, slow, down, unread)))
    text = render_status(doc, now=doc["taken_at"])
    assert (
        "RDMA: 2 of 4 ports active at 400 Gb/s, 200 Gb/s; down: mlx5_2/1 DOWN/Polling, mlx5_3/1 ?/?"
    ) in text.splitlines()


def test_no_rdma_no_line() -> None:
    for devices in (None, ()):
        doc = status_document(snapshot(infiniband=devices))
        assert "RDMA" not in render_status(doc, now=doc["taken_at"])
