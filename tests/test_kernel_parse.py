"""Kernel-log parsing: the shared corpus, every form the drivers print, and properties."""

from __future__ import annotations

import csv
import re
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import TEST_DATA
from gpuagent.kernel.parse import (
    KmsgRecord,
    canonical_pci,
    decode_line,
    parse_kmsg_record,
    parse_message,
)
from gpuagent.model import AerSeverity, KernelKind, KernelLine

CORPUS = TEST_DATA / "kmsg_corpus.tsv"
KINDS = frozenset(get_args(KernelKind))
AER_SEVERITIES = frozenset(get_args(AerSeverity))


def _corpus_rows() -> list[dict[str, str]]:
    with CORPUS.open(newline="", encoding="utf-8") as stream:
        return list(csv.DictReader(stream, delimiter="\t", quoting=csv.QUOTE_NONE))


CORPUS_ROWS = _corpus_rows()


def _corpus_params() -> list[object]:
    return [
        pytest.param(row, id=f"row{number}-{row['expected_kind']}")
        for number, row in enumerate(CORPUS_ROWS, 2)  # row 1 is the header
    ]


# --- the corpus (tests/data): every line parses to what its source says ---------------------------


@pytest.mark.parametrize("row", _corpus_params())
def test_corpus_line(row: dict[str, str]) -> None:
    parsed = parse_message(row["line"])
    expected = (
        row["expected_kind"],
        None if row["expected_code"] == "-" else int(row["expected_code"]),
        None if row["expected_pci"] == "-" else row["expected_pci"],
    )
    assert (parsed.kind, parsed.code, parsed.pci) == expected, (
        f"{row['source']}\n{row['line']!r}\n-> {parsed}"
    )


def test_corpus_covers_every_kind() -> None:
    assert {row["expected_kind"] for row in CORPUS_ROWS} == KINDS


# --- where on the die an Xid 13 happened --------------------------------------------------------

Location = tuple[int | None, int | None, int | None]
NO_LOCATION: Location = (None, None, None)
_OPENWALL = "NVRM: Xid (PCI:0000:05:00): 13, "
XID13_LOCATIONS = [
    # leptonai/gpud#46: one H100 crash, three lines; only the first two name a place.
    pytest.param(
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
        "name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal "
        "Instruction Parameter",
        (7, 7, 0),
    ),
    pytest.param(
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
        "name=<unknown>, Graphics SM Global Exception on (GPC 7, TPC 7, SM 0): Multiple Warp "
        "Errors",
        (7, 7, 0),
    ),
    pytest.param(
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
        "name=<unknown>, Graphics Exception: ESR 0x57c730=0xc04000b 0x57c734=0x24 "
        "0x57c728=0x1f81fb60 0x57c72c=0x1174",
        NO_LOCATION,
    ),
    # NVIDIA/NVSentinel's parser tests (csv_test.go at 3e97fd0)
    pytest.param(
        "NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp "
        "Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",
        (1, 3, 0),
    ),
    pytest.param(
        "NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: "
        "ESR 0x50df30=0x107000e 0x50df34=0x20 0x50df28=0xf81eb60 0x50df2c=0x1174",
        NO_LOCATION,
    ),
    # openwall/john#2491 (2017): the older form names a GPC and a TPC, no SM.
    pytest.param(
        "[139600.598066] " + _OPENWALL + "Graphics SM Warp Exception on (GPC 0, TPC 0): Out Of "
        "Range Address",
        (0, 0, None),
    ),
    pytest.param(
        "[139600.598136] " + _OPENWALL + "Graphics SM Global Exception on (GPC 1, TPC 0): "
        "Physical Multiple Warp Errors",
        (1, 0, None),
    ),
    pytest.param(
        "[139600.598079] " + _OPENWALL + "Graphics Exception: ESR 0x504648=0x1000e 0x504650=0x4 "
        "0x504644=0x13eff2 0x50464c=0x7f",
        NO_LOCATION,
    ),
    # Made up (another tool's test fixture): an Xid 31 holding an Xid 13's words is no Xid 13.
    pytest.param(
        "NVRM: Xid (PCI:0000:01:00): 31, pid=3234, Graphics SM Warp Exception on (GPC 2, TPC 2,"
        " SM 1): Out Of Range Address",
        NO_LOCATION,
    ),
]


@pytest.mark.parametrize(("line", "location"), XID13_LOCATIONS)
def test_xid13_location(line: str, location: Location) -> None:
    parsed = parse_message(line)
    assert parsed.kind == "xid"
    assert (parsed.gpc, parsed.tpc, parsed.sm) == location


def test_every_corpus_xid13_naming_a_gpc_has_its_location() -> None:
    for row in CORPUS_ROWS:
        parsed = parse_message(row["line"])
        names_one = row["expected_code"] == "13" and "(GPC " in row["line"]
        assert (parsed.gpc is not None) is names_one, row["line"]
        assert (parsed.tpc is not None) is names_one, row["line"]


# --- each form the drivers print ---------------------------------------------------------------

Case = tuple[str, str, int | None, str | None, int | None, str | None, str | None]


def case(
    line: str,
    kind: str,
    code: int | None = None,
    pci: str | None = None,
    *,
    pid: int | None = None,
    process: str | None = None,
    aer: str | None = None,
) -> Case:
    return (line, kind, code, pci, pid, process, aer)


CASES: list[Case] = [
    # Xid: pre-2013 drivers print the bus id without "PCI:"
    case("NVRM: Xid (0000:03:00): 13, 0000 00000000 ...", "xid", 13, "0000:03:00"),
    case(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
        *("xid", 79, "0000:3b:00"),
        pid=1234,
        process="python3",
    ),
    case(
        "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception",
        *("xid", 13, "0000:cb:00"),
    ),
    case(
        "NVRM: Xid (PCI:0000:00:01.0): 79, pid='<unknown>', name='<unknown>', GPU has fallen",
        *("xid", 79, "0000:00:01.0"),
    ),
    case(
        "NVRM: Xid (PCI:0000:0f:00): 64, pid=57530, Row Remapper Error: (0x5d28c03a0)",
        *("xid", 64, "0000:0f:00"),
        pid=57530,
    ),
    case("NVRM: Xid (PCI:0000:04:00): 79, GPU has fallen off the bus", "xid", 79, "0000:04:00"),
    case("NVRM: Xid (PCI:0000:01:00): 79", "xid", 79, "0000:01:00"),
    case("NVRM: Xid (PCI:0000:01:00): 8, pid=0", "xid", 8, "0000:01:00", pid=0),
    # the process name is the comm, which may hold a space
    case(
        "NVRM: Xid (PCI:0000:01:00): 13, pid=4242, name=Web Content, Graphics SM Warp Exception",
        *("xid", 13, "0000:01:00"),
        pid=4242,
        process="Web Content",
    ),
    # NVLink5 extended format, XIDs 144-150, with and without the process
    case(
        "NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal"
        " XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
        *("xid", 145, "0018:01:00"),
        pid=876767,
        process="ray::WorkerDict",
    ),
    case(
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000"
        " 0x00000000 0x00000000 0x00000000 0x00000000)",
        *("xid", 149, "0019:01:00"),
    ),
    case(
        "NVRM: Xid (PCI:0008:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link -1 (0x00000001 0x0)",
        *("xid", 144, "0008:01:00"),
    ),
    # something else inside the parentheses (an instance suffix) is tolerated
    case(
        "NVRM: Xid (PCI:0000:41:00 GPU-I:05): 43, pid=7, name=job, channel 0x0b00000a",
        *("xid", 43, "0000:41:00"),
        pid=7,
        process="job",
    ),
    # not an Xid report: no parentheses (DCGM's reader rejects this form too)
    case("NVRM: Xid PCI:0000:01:00: 43, pid=1, name=x, Ch 00000018", "other_nvrm"),
    # SXid from nvidia-nvswitch: the code is the SXid
    case(
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted"
        " PRIV error (First)",
        *("sxid", 12028, "0000:05:00.0"),
    ),
    case(
        "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS crumbstore",
        *("sxid", 28006, "0000:c1:00.0"),
    ),
    case(
        "nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALT data[0] = 0x               0",
        *("sxid", 26006, "0004:00:00.0"),
    ),
    case(
        "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
        *("sxid", 20034, "0000:06:00.0"),
    ),
    case("NVSwitch SXid summary: 3 errors", "noise"),
    # the GPU has fallen off the bus, in every wording
    case(
        "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
        *("fallen_off_bus", None, "0000:91:00.0"),
    ),
    case(
        "NVRM: GPU at PCI:0000:01:00: GPU has fallen off the bus.",
        *("fallen_off_bus", None, "0000:01:00"),
    ),
    case(
        "NVRM: GPU at 0000:01:00.0 has fallen off the bus.",
        *("fallen_off_bus", None, "0000:01:00.0"),
    ),
    case("NVRM: The NVIDIA GPU 0000:b3:00.0", "fallen_off_bus", None, "0000:b3:00.0"),
    case("NVRM: (PCI ID: 10de:26b5) installed in this system has", "fallen_off_bus"),
    case("NVRM: fallen off the bus and is not responding to commands.", "fallen_off_bus"),
    case(
        "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:2d04) installed in this system has",
        *("fallen_off_bus", None, "0000:01:00.0"),
    ),
    # the same three lines as one journal entry
    case(
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.",
        *("fallen_off_bus", None, "0000:b3:00.0"),
    ),
    # other "The NVIDIA GPU" messages say something else
    case(
        "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1b80)",
        *("other_nvrm", None, "0000:01:00.0"),
    ),
    # GSP: RPC timeouts and errors that are not themselves Xid lines
    case("NVRM: GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out", "gsp"),
    case(
        "NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of every"
        " 30).  The GPU likely needs to be reset.",
        *("gsp", None, "0000:9b:00"),
    ),
    case("NVRM: _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 78!", "gsp"),
    case("NVRM: GPU4 RPC history (CPU -> GSP):", "gsp"),
    case("NVRM: kgspInitRm_IMPL: cannot bootstrap GSP-RM", "gsp"),
    case("NVRM: RmFetchGspRmImages: No firmware image found", "gsp"),
    # the kernel's firmware loader (drivers/base/firmware_loader) missing the driver's GSP
    # firmware: with the device dev_warn() names, without one, and Debian's wording
    case(
        "nvidia 0000:3b:00.0: Direct firmware load for nvidia/535.161.08/gsp_ga10x.bin failed"
        " with error -2",
        *("gsp", None, "0000:3b:00.0"),
    ),
    case(
        "[    5.123456] nvidia 0000:c1:00.0: Direct firmware load for"
        " nvidia/550.54.15/gsp_tu10x.bin failed with error -2",
        *("gsp", None, "0000:c1:00.0"),
    ),
    case("Direct firmware load for nvidia/535.161.08/gsp_ga10x.bin failed with error -2", "gsp"),
    case(
        "(NULL device *): Direct firmware load for nvidia/510.47.03/gsp.bin failed with error -2",
        "gsp",
    ),
    case(
        "nvidia 0000:3b:00.0: firmware: failed to load nvidia/535.161.08/gsp_ga10x.bin (-2)",
        *("gsp", None, "0000:3b:00.0"),
    ),
    # ...but other firmware is not the NVIDIA driver's GSP firmware
    case(
        "iwlwifi 0000:00:14.3: Direct firmware load for iwlwifi-so-a0-gf-a0-86.ucode failed with"
        " error -2",
        "noise",
    ),
    case(
        "nouveau 0000:01:00.0: Direct firmware load for nvidia/tu102/gsp/gsp-535.113.01.bin"
        " failed with error -2",
        "noise",
    ),
    case(
        "i915 0000:00:02.0: Direct firmware load for i915/adlp_dmc.bin failed with error -2",
        "noise",
    ),
    case("firmware_class: See https://wiki.debian.org/Firmware for information about", "noise"),
    # an Xid about GSP is an Xid
    case(
        "NVRM: Xid (PCI:0000:9b:00): 119, pid=28098, name=gpu-feature-dis, Timeout after 45s of"
        " waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL).",
        *("xid", 119, "0000:9b:00"),
        pid=28098,
        process="gpu-feature-dis",
    ),
    # the user-space driver and the kernel module disagree
    case("NVRM: API mismatch: the client has the version 570.153.02, but", "driver_mismatch"),
    case(
        "NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)",
        "driver_mismatch",
        pid=1005,
        process="kwin_wayland",
    ),
    # the wording that names no client spreads the sentence over two records, one version
    # in each: both are the mismatch (either may be all the log still holds)
    case("NVRM: API mismatch: the client has the version 535.104.05, but", "driver_mismatch"),
    case("NVRM: this kernel module has the version 535.86.10.  Please", "driver_mismatch"),
    case(
        "Aug 14 13:29:34 node7 kernel: [1401266.786900] NVRM: this kernel module has the version"
        " 169.12.  Please",
        "driver_mismatch",
    ),
    # ...the trailing records carry no version and stay other driver messages
    case("NVRM: make sure that this kernel module and all NVIDIA driver", "other_nvrm"),
    case("NVRM: components have the same version.", "other_nvrm"),
    # the same message as one record (a journal entry, or a log that joined the lines)
    case(
        "[Sat Apr 13 23:38:47 2024] NVRM: API mismatch: the client has the version 535.171.04,"
        " but\n                           NVRM: this kernel module has the version 535.161.07."
        "  Please",
        "driver_mismatch",
    ),
    case(
        "NVRM: API mismatch: the client has the version 535.104.05, but this kernel module has"
        " the version 535.86.10.  Please make sure that this kernel module and all NVIDIA driver"
        " components have the same version.",
        "driver_mismatch",
    ),
    case(
        "NVRM: API mismatch: the client 'nvidia-smi' (pid 4242)",
        "driver_mismatch",
        pid=4242,
        process="nvidia-smi",
    ),
    case("NVRM: A GPU crash dump has been created. If possible, please run", "crash_dump"),
    # other driver messages, with the GPU when they name one
    case(
        "NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d",
        *("other_nvrm", None, "0000:9b:00"),
    ),
    case(
        "NVRM: GPU 0000:13:00.0: RmInitAdapter failed! (0x26:0x56:1463)",
        *("other_nvrm", None, "0000:13:00.0"),
    ),
    case(
        "nvidia: probe of 0000:5d:00.0 failed with error -1",
        *("other_nvrm", None, "0000:5d:00.0"),
    ),
    case("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01", "other_nvrm"),
    case(
        "NVRM: krcRcAndNotifyAllChannels_IMPL: RC all channels for critical error 79.", "other_nvrm"
    ),
    # PCIe AER, from the port driver and from nvidia, in old and new kernels' wording. A root
    # port's announcement is about the function it names as the source, not the port.
    case(
        "pcieport 0000:00:1c.0: AER: Corrected error received: 0000:00:1c.0",
        *("aer", None, "0000:00:1c.0"),
        aer="corrected",
    ),
    case(
        "pcieport 0000:00:01.0: AER: Multiple Corrected error received: 0000:01:00.0",
        *("aer", None, "0000:01:00.0"),
        aer="corrected",
    ),
    case(
        "pcieport 0000:00:01.0: AER: Correctable error message received from 0000:01:00.0",
        *("aer", None, "0000:01:00.0"),
        aer="corrected",
    ),
    case(
        "pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:01:00.0",
        *("aer", None, "0000:01:00.0"),
        aer="nonfatal",
    ),
    case(
        "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0",
        *("aer", None, "0000:01:00.0"),
        aer="fatal",
    ),
    case(
        "nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Non-Fatal),"
        " type=Transaction Layer, (Requester ID)",
        *("aer", None, "0000:3b:00.0"),
        aer="nonfatal",
    ),
    case(
        "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction"
        " Layer, (Requester ID)",
        *("aer", None, "0000:3b:00.0"),
        aer="fatal",
    ),
    case(
        "pcieport 0000:00:03.1: PCIe Bus Error: severity=Correctable, type=Data Link Layer,"
        " (Transmitter ID)",
        *("aer", None, "0000:00:03.1"),
        aer="corrected",
    ),
    case(
        "nvidia 0000:3b:00.0: AER:   device [10de:2330] error status/mask=00000001/0000e000",
        *("aer", None, "0000:3b:00.0"),
    ),
    case(
        "pcieport 0000:00:1c.0:   device [8086:9d10] error status/mask=00002001/00002000",
        *("aer", None, "0000:00:1c.0"),
    ),
    case(
        "nvidia 0000:3b:00.0:    [ 0] RxErr                  (First)", "aer", None, "0000:3b:00.0"
    ),
    case("nvidia 0000:3b:00.0: AER:    [12] Timeout", "aer", None, "0000:3b:00.0"),
    case(
        "pcieport 0000:00:03.0:   TLP Header: 40000001 0000000f 9c7ff000 00000000",
        *("aer", None, "0000:00:03.0"),
    ),
    case(
        "pcieport 0000:00:03.0: AER: Root Port link has been reset (0)", "aer", None, "0000:00:03.0"
    ),
    case(
        "nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)",
        *("aer", None, "0000:03:00.0"),
    ),
    # ...but not the port driver starting up, nor other device messages
    case("pcieport 0000:00:01.0: AER: enabled with IRQ 24", "noise"),
    case("pcieport 0000:02:02.0: Refused to change power state, currently in D3", "noise"),
    case("nvidia 0000:01:00.0: irq 52 for MSI/MSI-X", "noise"),
    case("nvidia-nvlink: Nvlink Core is being initialized, major device number 239", "noise"),
    case("nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context", "noise"),
    case("kernel: GPU crash dump saved to /sys/class/drm/card0/error", "noise"),
    case("", "noise"),
    case("   \n", "noise"),
    # damaged headers: a control character inside the code or the bus id is not a report,
    # and "3\x001" is never Xid 3 (nor 31); the code must end at ",", a blank or the end
    case("NVRM: Xid (PCI:0000:3b:00): 3\x001, pid=1234, name=python3, Graphics", "other_nvrm"),
    case("NVRM: Xid (PCI:0000:3b:00): 3\x001, Graphics Exception", "other_nvrm"),
    case("NVRM: Xid (PCI:0000:3b:00): 79\x07", "other_nvrm"),
    case("NVRM: Xid (PCI:0000:3b:00): 79\x1b[0m, GPU has fallen", "other_nvrm"),
    case("NVRM: Xid (PCI:0000:3b:00\x00): 79, pid=1234, name=python3", "other_nvrm"),
    case("NVRM: Xid (PCI:0000:3b:00 \x00 junk): 13, Graphics Exception", "other_nvrm"),
    case("NVRM: Xid (PCI:0000:3b:00): 79abc", "other_nvrm"),
    case("NVRM: Xid (PCI:0000:3b:00): 13\t, Graphics Exception", "xid", 13, "0000:3b:00"),
    case("NVRM: Xid (PCI:0000:3b:00): 79\r", "xid", 79, "0000:3b:00"),
    case("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12\x00028, Non-fatal, Link 32", "noise"),
    case("nvidia-nvswitch0: SXid (PCI:0000:05:00.0\x01): 12028, Non-fatal", "noise"),
    # a /dev/kmsg header with a control character in its flags is not stripped as one
    case(
        "4,1,2,-\x00;NVRM: Xid (PCI:0000:3b:00): 3\x001, GPU",
        "other_nvrm",
    ),
]


@pytest.mark.parametrize(
    ("line", "kind", "code", "pci", "pid", "process", "aer_severity"),
    CASES,
    ids=[f"{index}-{case[1]}" for index, case in enumerate(CASES)],
)
def test_driver_forms(
    line: str,
    kind: str,
    code: int | None,
    pci: str | None,
    pid: int | None,
    process: str | None,
    aer_severity: str | None,
) -> None:
    parsed = parse_message(line)
    assert (parsed.kind, parsed.code, parsed.pci) == (kind, code, pci)
    assert (parsed.pid, parsed.process, parsed.aer_severity) == (pid, process, aer_severity)


# --- prefixes: the same message under every header it may arrive with ---------------------

MESSAGE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
PREFIXES = [
    "",  # the bare message, as /dev/kmsg gives it after the ";"
    "4,1234,567890123,-;",  # a whole /dev/kmsg record line
    "4,1234,567890123,c,caller=T42;",  # with a continuation flag and an extra field
    "[  123.456789] ",  # dmesg
    "[6781741.548779] ",
    "[  +0.000844] ",  # dmesg --reltime / -d
    "[  239.061387 <    0.000011>] ",  # dmesg -d
    "[123] ",
    "[Sun Feb 23 16:24:18 2025] ",  # dmesg -T
    "[Mon Aug  5 03:54:13 2024] ",
    "<4>[  123.456789] ",  # dmesg -r
    "kern  :err   : [  123.456789] ",  # dmesg -x
    "syslog:err   : 2025-05-27T04:18:56,089671+00:00 ",  # dmesg -x --time-format iso
    "Jul 09 10:42:47 pool0-0082 kernel: ",  # syslog / journalctl
    "Jan  3 07:39:45 ubuntu kernel: [17257.355551] ",
    "Mar 21 21:42:01 kernel: ",  # journal, host removed
    "jan. 29 20:50:17 kevin kernel: ",  # a localised month
    "2026-09-08T01:00:00+0000 n1 kernel: ",  # journalctl -o short-iso
    "2024-01-15T03:00:00.123456+00:00 gpu-node-7 kernel: ",  # rsyslog, RFC 3339
    "192.168.11.119: kern: warning: [2026-04-22T21:30:51.526447914Z]: ",  # Talos
    "kernel: ",
    "               ",  # a multi-line journal entry's indent
    # CONFIG_PRINTK_CALLER: the caller (thread or CPU) after the time, with a blank as
    # util-linux dmesg prints it, without as the console and syslog(2) do
    "[   36.712345] [  T291] ",
    "[   36.712345][  T291] ",
    "[ 1234.5] [    C3] ",
    "[    0.000000] [    T0] ",
    "[ 1234.567890] [C123456] ",
    "[Wed Jul 31 11:22:39 2024] [  T291] ",  # dmesg -T
    "<4>[   36.712345][  T291] ",  # dmesg -r
    "Jul 31 11:22:39 host kernel: [   36.712345][  T291] ",  # syslog of the console format
    "Jul 31 11:22:39 host kernel: ",  # journalctl -k
    "[Wed Jul 31 11:22:39 2024] ",  # dmesg -T
]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_prefixes_are_stripped(prefix: str) -> None:
    parsed = parse_message(f"{prefix}{MESSAGE}\n")
    assert parsed == KernelLine(
        kind="xid", code=79, pci="0000:3b:00", pid=1234, process="python3", text=MESSAGE
    )


# One line of each kind, to be read the same under a caller id as without one.
CALLER_PREFIXED = [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=291, name=python, GPU has fallen off the bus.", "xid"),
    ("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress", "sxid"),
    ("NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.", "fallen_off_bus"),
    ("pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0", "aer"),
    ("pcieport 0000:00:1c.0:   device [8086:9d10] error status/mask=00002001/00002000", "aer"),
    ("nvidia 0000:3b:00.0:    [ 0] RxErr                  (First)", "aer"),
    ("NVRM: GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out", "gsp"),
    (
        (
            "nvidia 0000:3b:00.0: Direct firmware load for nvidia/535.161.08/gsp_ga10x.bin"
            " failed with error -2"
        ),
        "gsp",
    ),
    ("NVRM: this kernel module has the version 535.86.10.  Please", "driver_mismatch"),
    ("NVRM: A GPU crash dump has been created. If possible, please run", "crash_dump"),
    ("nvidia: probe of 0000:5d:00.0 failed with error -1", "other_nvrm"),
    ("usb 1-4: new high-speed USB device number 3 using xhci_hcd", "noise"),
]
CALLERS = ["[   36.712345] [  T291] ", "[ 1234.5] [    C3] ", "[   36.712345][  T291] "]


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize(("message", "kind"), CALLER_PREFIXED)
def test_caller_id_is_stripped_for_every_kind(caller: str, message: str, kind: str) -> None:
    bare = parse_message(message)
    parsed = parse_message(caller + message)
    assert parsed.kind == kind
    assert parsed == bare
    assert parsed.text == message


def test_caller_examples_cover_every_kind() -> None:
    assert {kind for _, kind in CALLER_PREFIXED} == KINDS


@pytest.mark.parametrize(
    ("line", "text"),
    [
        ("Oct 03 17:59:22 mnemosyne systemd[1]: bluetooth.service skipped", "systemd[1]: "),
        ("[ 1234.5] [    C3] EDAC MC0: 1 CE memory read error", "EDAC MC0: "),
        ("6,3973,227986636,-;IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready", "IPv6: "),
        (" DEVICE=+acpi:PNP0A03:00", "DEVICE=+acpi:PNP0A03:00"),
        ("[Sun Feb 23 16:24:18 2025]  os_dump_stack+0xe/0x14 [nvidia]", "os_dump_stack+"),
    ],
)
def test_noise_keeps_its_message(line: str, text: str) -> None:
    parsed = parse_message(line)
    assert parsed.kind == "noise"
    assert parsed.text.startswith(text)


# --- PCI bus ids --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("PCI:0000:3b:00", "0000:3b:00.0"),
        ("0000:3b:00", "0000:3b:00.0"),
        ("0000:3B:00.0", "0000:3b:00.0"),
        ("00000000:3b:00.0", "0000:3b:00.0"),
        ("00000001:AB:1F.7", "0001:ab:1f.7"),
        ("3b:00.0", "0000:3b:00.0"),
        ("0009:01:00", "0009:01:00.0"),
        ("10000:e1:00.0", "10000:e1:00.0"),  # VMD domains go past 0xffff
        (" pci:0000:cb:00 ", "0000:cb:00.0"),
        ("3b:00", None),  # neither domain nor function: could be a time of day
        ("0000:3b:20.0", None),  # device numbers stop at 0x1f
        ("0000:3b:00.8", None),  # functions stop at 7
        ("0000:3b", None),
        ("GPU-509665ad", None),
        ("", None),
        ("0000:3g:00.0", None),
    ],
)
def test_canonical_pci(raw: str, canonical: str | None) -> None:
    assert canonical_pci(raw) == canonical


# --- /dev/kmsg records --------------------------------------------------------------------------


def test_kmsg_record() -> None:
    record = parse_kmsg_record(b"6,3973,227986636,-;IPv6: ADDRCONF(NETDEV_CHANGE): eth0: up\n")
    assert record == KmsgRecord(
        priority=6,
        facility=0,
        sequence=3973,
        usec=227986636,
        continuation=False,
        message="IPv6: ADDRCONF(NETDEV_CHANGE): eth0: up",
    )


def test_kmsg_record_facility_and_level() -> None:
    record = parse_kmsg_record(b"47,1639,370063740,-;systemd-journald[301]: Sent WATCHDOG=1.")
    assert record is not None
    assert (record.facility, record.priority) == (5, 7)  # (LOG_SYSLOG << 3) | LOG_DEBUG


@pytest.mark.parametrize(("flags", "continuation"), [(b"-", False), (b"c", True), (b"+", True)])
def test_kmsg_record_continuation(flags: bytes, continuation: bool) -> None:
    record = parse_kmsg_record(b"4,1227,437812449932," + flags + b";NVRM: Xid ...")
    assert record is not None
    assert record.continuation is continuation


def test_kmsg_record_dictionary_is_ignored() -> None:
    raw = (
        b"7,160,424069,-;pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)\n"
        b" SUBSYSTEM=acpi\n"
        b" DEVICE=+acpi:PNP0A03:00\n"
    )
    record = parse_kmsg_record(raw)
    assert record is not None
    assert record.message == "pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)"


def test_kmsg_record_unescapes() -> None:
    record = parse_kmsg_record(b"6,1,2,-;a\\x5cb\\x09c \\xe2\\x82\\xac; d\\x")
    assert record is not None
    assert record.message == "a\\b\tc \u20ac; d\\x"


def test_kmsg_record_invalid_utf8_is_replaced() -> None:
    record = parse_kmsg_record(b"6,1,2,-;caf\\xe9")
    assert record is not None
    assert record.message == "caf\ufffd"


def test_kmsg_record_more_fields_and_old_kernels() -> None:
    with_caller = parse_kmsg_record(b"6,1,2,-,caller=T17;message")
    without_flags = parse_kmsg_record(b"6,1,2;message")
    assert with_caller is not None
    assert without_flags is not None
    assert with_caller.message == without_flags.message == "message"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"no header at all",
        b" DEVICE=+acpi:PNP0A03:00",
        b"a,b,c,-;message",
        b"6,1;message",
        b"-6,1,2,-;message",
        b"6,1,2,-",
        b"6, 1,2,-;message",
        b"6,1_000,2,-;message",
        b"6," + b"9" * 5000 + b",2,-;message",
        b"\xff\xfe,1,2,-;message",
        # control characters (raw: the kernel escapes every one) in the header...
        b"3\x001,2,3,-;NVRM: Xid (PCI:0000:3b:00): 79",
        b"3,1\x00,2,-;message",
        b"6,1,2,-\x00;message",
        b"6,1,2,\x01;message",
        b"6,1,2,-,caller=T1\x00;message",
        b"6,1,2,-\r;message",
        b"\x006,1,2,-;message",
        b"6,1,2,-,caller=T1 x;message",
        b"6,1,2,-,caller=\xc3\xa9;message",
        # ...and in the message
        b"4,1,2,-;NVRM: Xid (PCI:0000:3b:00): 3\x001, GPU has fallen off the bus.",
        b"6,1,2,-;message\x1b[0m",
        b"6,1,2,-;mess\x7fage",
        b"6,1,2,-;message\r\r",
        b"6,1,2,-;\x00\x00\x00\x00",
    ],
)
def test_malformed_kmsg_records(raw: bytes) -> None:
    assert parse_kmsg_record(raw) is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"6,1,2,-;message\r", "message"),  # a CRLF line ending
        (b"6,1,2,-;a\tb", "a\tb"),
        (b"6,1,2,-;message\n SUBSYSTEM=\x01pci\x00", "message"),  # the dictionary is ignored
    ],
)
def test_kmsg_records_tolerated_bytes(raw: bytes, message: str) -> None:
    record = parse_kmsg_record(raw)
    assert record is not None
    assert record.message == message


def test_escaped_control_characters_are_not_read_as_an_xid() -> None:
    # The kernel escaped it, so the record stands; its message is no Xid report.
    record = parse_kmsg_record(b"4,1,2,-;NVRM: Xid (PCI:0000:3b:00): 3\\x001, GPU")
    assert record is not None
    assert record.message == "NVRM: Xid (PCI:0000:3b:00): 3\x001, GPU"
    parsed = parse_message(record.message)
    assert (parsed.kind, parsed.code) == ("other_nvrm", None)


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"[  12.5] NVRM: Xid (PCI:0000:3b:00): 79", "[  12.5] NVRM: Xid (PCI:0000:3b:00): 79"),
        (b"Jul 09 10:42:47 node kernel: x\r", "Jul 09 10:42:47 node kernel: x"),
        (b"tab\tseparated", "tab\tseparated"),
        (b"caf\xe9", "caf\ufffd"),
        (b"", ""),
        (b"NVRM: Xid (PCI:0000:3b:00): 3\x001, GPU has fallen off the bus.", None),
        (b"\x00\x00\x00\x00Jul 09 10:42:47 node kernel: NVRM: Xid", None),  # after a crash
        (b"\x1b[31mNVRM\x1b[0m: Xid (PCI:0000:3b:00): 79", None),
        (b"line\r\r", None),
        (b"a\x7fb", None),
    ],
)
def test_decode_line(raw: bytes, text: str | None) -> None:
    assert decode_line(raw) == text


def test_kmsg_record_message_parses() -> None:
    record = parse_kmsg_record(b"4,1234,5678,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen")
    assert record is not None
    assert parse_message(record.message).code == 79


# --- properties: any input, never an exception, always a valid answer -----------------------


def _check_line(parsed: KernelLine) -> None:
    assert parsed.kind in KINDS
    assert isinstance(parsed.text, str)
    assert parsed.aer_severity is None or parsed.aer_severity in AER_SEVERITIES
    if parsed.code is not None:
        assert parsed.kind in {"xid", "sxid"}
        assert parsed.code >= 0
    if parsed.pid is not None:
        assert parsed.pid >= 0
    assert (parsed.aer_severity is None) or parsed.kind == "aer"


@given(st.text())
def test_any_text_parses(text: str) -> None:
    _check_line(parse_message(text))


# Lines the driver really prints, for mutation: the corpus, else this file's own cases.
SEED_LINES = [row["line"] for row in CORPUS_ROWS] or [case[0] for case in CASES]


@given(
    line=st.sampled_from(SEED_LINES),
    edits=st.lists(
        st.tuples(st.integers(0, 400), st.integers(0, 12), st.text(max_size=12)), max_size=6
    ),
)
@settings(max_examples=500)
def test_mutated_lines_parse(line: str, edits: list[tuple[int, int, str]]) -> None:
    for position, deleted, inserted in edits:
        at = position % (len(line) + 1)
        line = line[:at] + inserted + line[at + deleted :]
    _check_line(parse_message(line))


_KEYWORDS = st.sampled_from(
    [
        *("NVRM: ", "Xid (PCI:", "SXid (", "): ", ", pid=", ", name=", "<unknown>", "'"),
        *("AER: ", "PCIe Bus Error: ", "severity=Uncorrected (Fatal)", "nvidia 0000:01:00.0: "),
        *("0000:3b:00", ".0", "fallen off the bus", "GSP", "\n", "[ 12.5] ", "kernel: "),
        "9" * 30,
    ]
)


@given(st.lists(st.one_of(_KEYWORDS, st.text(max_size=5)), max_size=12))
def test_keyword_soup_parses(parts: list[str]) -> None:
    _check_line(parse_message("".join(parts)))


@given(st.binary())
def test_any_bytes_as_kmsg_record(raw: bytes) -> None:
    record = parse_kmsg_record(raw)
    assert record is None or 0 <= record.priority <= 7


_KMSG_HEADERS = st.builds(
    lambda prio, seq, usec, flags: f"{prio},{seq},{usec},{flags};".encode(),
    st.integers(0, 191),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.sampled_from(["-", "c", "+", "-,caller=T1"]),
)


def _kernel_escape(message: str) -> bytes:
    """What the kernel writes to /dev/kmsg for ``message`` (printk's ext text escaping)."""
    out = bytearray()
    for byte in message.encode():
        if byte < 0x20 or byte >= 0x7F or byte == 0x5C:
            out += b"\\x%02x" % byte
        else:
            out.append(byte)
    return bytes(out)


@given(_KMSG_HEADERS, st.text(st.characters(exclude_categories=["Cs"])))
def test_kmsg_records_round_trip(header: bytes, message: str) -> None:
    record = parse_kmsg_record(header + _kernel_escape(message) + b"\n SUBSYSTEM=pci\n")
    assert record is not None
    assert record.message == message
    prio = int(header.split(b",")[0])
    assert (record.facility, record.priority) == (prio >> 3, prio & 7)


_CANONICAL = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


@given(st.text(max_size=40))
def test_canonical_pci_any_text(raw: str) -> None:
    canonical = canonical_pci(raw)
    if canonical is not None:
        assert _CANONICAL.fullmatch(canonical)
        assert canonical_pci(canonical) == canonical


@given(
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFF),
    st.integers(0, 0x1F),
    st.integers(0, 7),
    st.sampled_from(["{d:04x}:{b:02x}:{s:02x}.{f}", "{d:08X}:{b:02X}:{s:02X}.{f}"]),
    st.sampled_from(["", "PCI:"]),
)
def test_canonical_pci_forms(
    domain: int, bus: int, slot: int, function: int, form: str, prefix: str
) -> None:
    raw = prefix + form.format(d=domain, b=bus, s=slot, f=function)
    assert canonical_pci(raw) == f"{domain:04x}:{bus:02x}:{slot:02x}.{function}"


# A root port announces each error it received and names its source: the error is the
# source's (the GPU below the port). Real lines (tests/data/kmsg_corpus.tsv, and the
# kernel's wordings of 4.19-6.x, 6.x and earlier kernels' id= form), and the port's own
# report lines, which stay the port's.
@pytest.mark.parametrize(
    ("line", "pci", "severity"),
    [
        pytest.param(
            "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:86:00.0",
            "0000:86:00.0",
            "fatal",
            id="received-colon",
        ),
        pytest.param(
            "pcieport 0000:00:01.0: AER: Uncorrectable (Fatal) error message received from "
            "0000:86:00.0",
            "0000:86:00.0",
            "fatal",
            id="message-received-from",
        ),
        pytest.param(
            "pcieport 0000:00:01.0: AER: Multiple Uncorrectable (Non-Fatal) error message "
            "received from 0000:86:00.0",
            "0000:86:00.0",
            "nonfatal",
            id="multiple-message-received-from",
        ),
        pytest.param(
            "pcieport 0000:00:1c.0: AER: Multiple Corrected error received: id=00e5",
            "0000:00:1c.5",
            "corrected",
            id="old-id-form",
        ),
        pytest.param(
            "pcieport 0002:80:01.0: AER: Uncorrected (Fatal) error received: id=8600",
            "0002:86:00.0",
            "fatal",
            id="old-id-form-in-the-ports-domain",
        ),
        pytest.param(
            "[  253.765953] pcieport 0000:00:1c.0: AER: Corrected error received: 0000:00:1c.0",
            "0000:00:1c.0",
            "corrected",
            id="the-port-its-own-source",
        ),
        pytest.param(
            "jan. 29 20:50:17 kevin kernel: pcieport 0000:00:1c.5: PCIe Bus Error: "
            "severity=Corrected, type=Physical Layer, id=00e5(Receiver ID)",
            "0000:00:1c.5",
            "corrected",
            id="report-with-id-is-the-printers",
        ),
        pytest.param(
            "[  +0.000004] pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
            "type=Transaction Layer, (Requester ID)",
            "0000:00:03.0",
            "fatal",
            id="report-is-the-printers",
        ),
    ],
)
def test_an_aer_announcement_names_its_source(line: str, pci: str, severity: str) -> None:
    parsed = parse_message(line)
    assert (parsed.kind, parsed.pci, parsed.aer_severity) == ("aer", pci, severity)
