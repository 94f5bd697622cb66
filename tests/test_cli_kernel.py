"""`gpuagent kmsg parse`, `gpuagent xid explain` and `xid list`, run as an operator runs them."""

from __future__ import annotations

import csv
import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TEST_DATA, run_cli

XID_79 = "[ 5107.644336] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
LOG = [
    "Jul 09 10:42:47 node kernel: IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    XID_79,
    (
        "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828,"
        " name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"
    ),
    "NVRM: Xid (PCI:0000:3b:00): 999, something new",
    "4,1234,5678,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32",
    "pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer",
    "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:3b:00): 162, pid=1, name=x, power smoothing",
]
JSON_KEYS = {
    "kind",
    "code",
    "pci",
    "gpu",
    "pid",
    "process",
    "aer_severity",
    "mnemonic",
    "description",
    "category",
    "severity",
    "action",
    "investigatory_action",
    "app_error",
    "text",
}


def gpuagent(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "gpuagent", *args],
        input=stdin,
        capture_output=True,
        check=False,
        timeout=30,
    )
    return subprocess.CompletedProcess(
        result.args, result.returncode, result.stdout.decode(), result.stderr.decode()
    )


def _lines(text: str) -> list[str]:
    return text.splitlines()


# --- kmsg parse ------------------------------------------------------------------------------


def test_kmsg_parse_explains_and_skips_noise(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text("\n".join(LOG) + "\n")
    result = run_cli("kmsg", "parse", str(log))
    assert result.returncode == 0, result.stderr
    assert _lines(result.stdout) == [
        (
            "2: xid 79 on 0000:3b:00.0: GPU has fallen off the bus"
            " (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS) -> RESTART_BM: reboot the node"
        ),
        (
            "3: xid 109 on 0000:cb:00.0 [pid 1797828 pt_main_thread]: Context Switch Timeout Error"
            " (ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR) -> RESET_GPU: drain and reset the GPU"
        ),
        (
            "4: xid 999 on 0000:3b:00.0: unknown XID 999 (not in the catalog):"
            " NVRM: Xid (PCI:0000:3b:00): 999, something new"
        ),
        (
            "5: sxid 12028 on 0000:05:00.0: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028,"
            " Non-fatal, Link 32"
        ),
        (
            "6: aer (fatal) on 0000:00:03.0: pcieport 0000:00:03.0: PCIe Bus Error:"
            " severity=Uncorrected (Fatal), type=Transaction Layer"
        ),
        "7: fallen_off_bus on 0000:91:00.0: NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
        (
            "8: xid 162 on 0000:3b:00.0 [pid 1 x]: Power Smoothing HW Circuitry capability"
            " reengaged (PSHC_REENGAGED); the catalog names no action"
        ),
    ]


@pytest.mark.parametrize("args", [(), ("-",)])
def test_kmsg_parse_reads_stdin(args: tuple[str, ...]) -> None:
    result = gpuagent("kmsg", "parse", *args, stdin=f"{XID_79}\n".encode())
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("1: xid 79 on 0000:3b:00.0: ")


def test_kmsg_parse_answers_a_live_feed_line_by_line() -> None:
    # `journalctl -kf | gpuagent kmsg parse`: each answer comes before the input ends,
    # though stdout is a pipe (block-buffered unless PYTHONUNBUFFERED says otherwise).
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuagent", "kmsg", "parse", "--json"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        process.stdin.write(f"{XID_79}\n".encode())
        process.stdin.flush()
        readable, _, _ = select.select([process.stdout], [], [], 10)
        assert readable, "no answer while the input is still open"
        assert json.loads(process.stdout.readline())["code"] == 79
    finally:
        process.stdin.close()
        process.wait(timeout=20)
        process.stdout.close()
    assert process.returncode == 0


def test_kmsg_parse_json_one_object_per_line() -> None:
    result = gpuagent("kmsg", "parse", "--json", stdin="\n".join(LOG).encode())
    assert result.returncode == 0, result.stderr
    docs = [json.loads(line) for line in _lines(result.stdout)]
    assert len(docs) == len(LOG)
    assert all(set(doc) == JSON_KEYS for doc in docs)
    noise, xid79, xid109, unknown, sxid, aer, fallen, unclassified = docs
    assert noise["kind"] == "noise"
    assert noise["text"] == "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready"
    assert noise["severity"] is None
    assert xid79 == {
        "kind": "xid",
        "code": 79,
        "pci": "0000:3b:00",
        "gpu": "0000:3b:00.0",
        "pid": None,
        "process": None,
        "aer_severity": None,
        "mnemonic": "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "description": "GPU has fallen off the bus",
        "category": "bus",
        "severity": "critical-node (reboot/power-cycle)",
        "action": "RESTART_BM",
        "investigatory_action": "CONTACT_SUPPORT",
        "app_error": False,
        "text": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    }
    assert (xid109["pid"], xid109["process"], xid109["app_error"]) == (
        1797828,
        "pt_main_thread",
        True,
    )
    assert unknown["severity"] == "unknown"
    assert unknown["mnemonic"] is unknown["action"] is unknown["app_error"] is None
    assert (sxid["kind"], sxid["code"], sxid["gpu"]) == ("sxid", 12028, "0000:05:00.0")
    assert sxid["severity"] is None
    assert (aer["kind"], aer["aer_severity"], aer["gpu"]) == ("aer", "fatal", "0000:00:03.0")
    assert (fallen["kind"], fallen["pci"]) == ("fallen_off_bus", "0000:91:00.0")
    assert (unclassified["action"], unclassified["mnemonic"]) == ("", "PSHC_REENGAGED")


def test_kmsg_parse_unescapes_kmsg_records() -> None:
    record = b"4,1,2,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=5, name=a\\x5cb, Graphics Exception\n"
    result = gpuagent("kmsg", "parse", "--json", stdin=record)
    doc = json.loads(result.stdout)
    assert (doc["code"], doc["pid"], doc["process"]) == (13, 5, "a\\b")


def test_kmsg_parse_survives_binary_garbage() -> None:
    garbage = bytes(range(256)) * 4 + b"\n\xff\xfe;;,,\n4,x,y,-;\n"
    result = gpuagent("kmsg", "parse", "--json", stdin=garbage)
    assert result.returncode == 0, result.stderr
    assert all(json.loads(line)["kind"] == "noise" for line in _lines(result.stdout))


def test_kmsg_parse_missing_file(tmp_path: Path) -> None:
    result = run_cli("kmsg", "parse", str(tmp_path / "absent.log"))
    assert result.returncode == 1
    assert "cannot read" in result.stderr


def test_kmsg_parse_the_corpus() -> None:
    corpus = TEST_DATA / "kmsg_corpus.tsv"  # a copy of ../shared/data's (tests/data/README.md)
    with corpus.open(newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream, delimiter="\t", quoting=csv.QUOTE_NONE))
    stdin = "".join(f"{row['line']}\n" for row in rows).encode()
    result = gpuagent("kmsg", "parse", "--json", stdin=stdin)
    assert result.returncode == 0, result.stderr
    kinds = [json.loads(line)["kind"] for line in _lines(result.stdout)]
    assert kinds == [row["expected_kind"] for row in rows]


# --- xid explain -------------------------------------------------------------------------------


def test_xid_explain() -> None:
    result = run_cli("xid", "explain", "79")
    assert result.returncode == 0, result.stderr
    assert _lines(result.stdout) == [
        "XID 79: ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "  gpuagent              CRITICAL: reboot required",
        "  action                drain_and_reboot",
        "  runbook               gpu-xid-reboot-required",
        "  description           GPU has fallen off the bus",
        "  category              bus",
        "  catalog severity      critical-node (reboot/power-cycle)",
        "  NVIDIA's action       RESTART_BM: reboot the node",
        "  investigatory action  CONTACT_SUPPORT",
        "  application error     no: NVIDIA's k8s-device-plugin marks the GPU unhealthy",
    ]


def test_xid_explain_says_what_the_xid_check_says() -> None:
    # Xid 48 is "uncorrectable ECC error, drain and reset required" in a finding; NVIDIA's
    # catalog only says to follow its decode workflow.
    out = run_cli("xid", "explain", "48").stdout
    assert (
        "  gpuagent              CRITICAL: uncorrectable ECC error, drain and reset required\n"
        in out
    )
    assert "  action                drain_and_reset\n" in out
    assert "  runbook               gpu-ecc-dbe\n" in out
    assert "  NVIDIA's action       WORKFLOW_XID_48: follow NVIDIA's decode workflow" in out


def test_xid_explain_a_line_decided_xid_says_what_decides() -> None:
    out = _lines(run_cli("xid", "explain", "154").stdout)
    assert out[1] == "  gpuagent              CRITICAL: contact support"
    assert out[2] == (
        "  decided by            the recovery action the line names: none (OK), GPU reset, "
        "node reboot, or drain and reset (CRITICAL)"
    )


def test_xid_explain_app_error_and_blank_action() -> None:
    out = run_cli("xid", "explain", "13").stdout
    assert "  gpuagent              WARN: application error\n" in out
    assert (
        "                        WARN for checks.xid.app_error_hold_seconds; CRITICAL above "
        "checks.xid.app_error_rate_per_hour incidents\n"
    ) in out
    assert "application error     yes" in out
    assert (
        "NVIDIA's action       none in the catalog yet" in run_cli("xid", "explain", "165").stdout
    )


def test_xid_explain_json() -> None:
    result = run_cli("xid", "explain", "119", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "xid": 119,
        "mnemonic": "GSP_RPC_TIMEOUT",
        "description": "GSP RPC Timeout",
        "category": "gsp",
        "severity": "critical-gpu (GPU reset)",
        "action": "RESET_GPU",
        "investigatory_action": "INVESTIGATE_SW",
        "app_error": False,
        "action_hint": "drain and reset the GPU",
        "gpuagent": {
            "severity": "CRITICAL",
            "verdict": "reset required",
            "action": "reset_gpu",
            "runbook": "gpu-xid-reset-required",
            "decided_by": "",
        },
    }


def test_xid_list() -> None:
    result = run_cli("xid", "list")
    assert result.returncode == 0, result.stderr
    lines = _lines(result.stdout)
    rows = {int(line.split()[0]): line for line in lines[1:] if line[:4].strip().isdigit()}
    assert sorted(rows) == list(range(1, 173))
    assert lines[0].split() == ["XID", "GPUAGENT", "ACTION", "NVIDIA"]
    assert rows[79].split(None, 3) == [
        "79",
        "CRITICAL",
        "drain_and_reboot",
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: GPU has fallen off the bus",
    ]
    assert rows[48].split()[1:3] == ["CRITICAL", "drain_and_reset"]
    assert rows[13].split()[1:3] == ["WARN", "restart_app"]
    assert rows[74].split()[1] == "CRITICAL*"  # its register dump decides
    assert lines[-1].startswith("* decided by the XID's line")


def test_xid_list_json_is_every_explain_document() -> None:
    listed = json.loads(run_cli("xid", "list", "--json").stdout)
    assert [entry["xid"] for entry in listed] == list(range(1, 173))
    assert listed[118] == json.loads(run_cli("xid", "explain", "119", "--json").stdout)


@pytest.mark.parametrize("args", [("400",), ("0",), ("400", "--json")])
def test_xid_explain_unknown(args: tuple[str, ...]) -> None:
    result = run_cli("xid", "explain", *args)
    assert result.returncode == 1
    assert f"unknown XID {args[0]}" in result.stderr
    assert result.stdout == ""


def test_xid_explain_needs_a_number() -> None:
    result = run_cli("xid", "explain", "seventy-nine")
    assert result.returncode == 2
    assert "invalid int value" in result.stderr


def test_cli_start_does_not_load_the_kernel_modules() -> None:
    # Building the parser (every command pays for it) must not import the parsers or catalog.
    code = (
        "import sys; from gpuagent import cli; cli._parser(); "
        "print(sorted(m for m in sys.modules if m.startswith('gpuagent.kernel')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert result.stdout.strip() == "[]"
