"""The --gpu resolver: every form names the same GPU, and a miss is an error that lists the
GPUs there are."""

from __future__ import annotations

import pytest

from gpuagent.gpuselect import KnownGpu, NoSuchGpuError, known_gpus, resolve_gpu, resolve_gpus

UUID_3 = "GPU-708b6be4-7057-f27a-7627-b5b1838a9342"
GPUS = [
    KnownGpu(0, "0000:18:00.0", "GPU-11111111-2222-3333-4444-555555555555"),
    KnownGpu(3, "0000:ba:00.0", UUID_3),
    KnownGpu(10, "0001:0a:1f.0", None),
]


@pytest.mark.parametrize(
    ("selector", "index"),
    [
        ("3", 3),
        ("03", 3),
        (" 3 ", 3),
        ("10", 10),
        ("0000:ba:00.0", 3),
        ("00000000:BA:00.0", 3),  # as metrics and alerts print it
        ("0000:BA:00.0", 3),
        ("ba:00.0", 3),
        ("BA:00.0", 3),
        ("0000:ba:00", 3),  # domain without the function
        ("PCI:0000:ba:00", 3),  # as an XID line prints it
        ("00000001:0A:1F.0", 10),
        (UUID_3, 3),
        (UUID_3.upper().replace("GPU-", "gpu-"), 3),
        ("0000:18:00.0", 0),
    ],
)
def test_each_form_names_the_gpu(selector: str, index: int) -> None:
    assert resolve_gpu(selector, GPUS).index == index


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("4", "no GPU with index 4"),
        ("0000:bb:00.0", "no GPU with PCI bus id 0000:bb:00.0"),
        ("00000000:BA:00.1", "no GPU with PCI bus id 00000000:BA:00.1"),
        ("0001:ba:00.0", "no GPU with PCI bus id 0001:ba:00.0"),
        ("GPU-00000000-0000-0000-0000-000000000000", "no GPU with UUID GPU-0000"),
        ("ba:00", "is not a GPU index, a PCI bus id"),  # reads as a time of day
        ("first", "'first' is not a GPU index"),
        ("", "is not a GPU index"),
        ("-1", "is not a GPU index"),
    ],
)
def test_a_miss_names_the_value_and_the_known_gpus(selector: str, message: str) -> None:
    with pytest.raises(NoSuchGpuError) as raised:
        resolve_gpu(selector, GPUS)
    text = str(raised.value)
    assert message in text
    assert "the daemon knows:\n  0  0000:18:00.0  GPU-1111" in text
    assert f"\n  3  0000:ba:00.0  {UUID_3}\n" in text
    assert text.endswith("\n  10  0001:0a:1f.0  -")


def test_no_gpus_at_all() -> None:
    with pytest.raises(NoSuchGpuError, match=r"no GPU with index 0; the daemon knows no GPU$"):
        resolve_gpu("0", [])


def test_several_selectors_each_gpu_once_by_index() -> None:
    chosen = resolve_gpus(["00000000:BA:00.0", "0", "3", UUID_3], GPUS)
    assert [gpu.index for gpu in chosen] == [0, 3]
    with pytest.raises(NoSuchGpuError, match="no GPU with index 7"):
        resolve_gpus(["0", "7"], GPUS)


def test_known_gpus_from_a_status_document() -> None:
    status = {
        "gpus": [
            {"index": 1, "pci_bus_id": "0000:2a:00.0", "uuid": "GPU-b", "health": "OK"},
            {"index": 0, "pci_bus_id": "0000:18:00.0", "uuid": "GPU-a", "health": "WARN"},
        ]
    }
    assert known_gpus(status) == [
        KnownGpu(0, "0000:18:00.0", "GPU-a"),
        KnownGpu(1, "0000:2a:00.0", "GPU-b"),
    ]
