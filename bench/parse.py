"""Kernel-log parser throughput: lines/s of parse_message on one core.

    .venv/bin/python bench/parse.py [--lines N] [--fault-share F] [--repeat R]

The mix is what a node's kernel log looks like: mostly noise (the corpus's noise lines
and synthetic dmesg/journal lines, some of them from the nvidia and pcieport drivers),
with the corpus's NVRM, Xid, SXid and AER lines mixed in at --fault-share. Prints a
one-row table; exits 1 below the target.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "data" / "kmsg_corpus.tsv"
sys.path.insert(0, str(REPO / "agent"))

from gpuagent.kernel.parse import parse_message  # noqa: E402

TARGET_LINES_PER_SECOND = 50_000

# Everyday kernel chatter, as dmesg, journal and /dev/kmsg give it; {n} a number, {h} hex.
NOISE_TEMPLATES = (
    '[{t}] audit: type=1400 audit({t}:{n}): apparmor="DENIED" operation="open" pid={n}',
    "[{t}] IPv6: ADDRCONF(NETDEV_CHANGE): eth{n}: link becomes ready",
    "[{t}] EXT4-fs (nvme0n1p{n}): mounted filesystem with ordered data mode. Quota mode: none.",
    "[{t}] mlx5_core 0000:{h}:00.0: mlx5_cmd_check:{n}: CREATE_MKEY(0x200) op_mod(0x0) failed",
    "[{t}] nvidia-uvm: Loaded the UVM driver, major device number {n}.",
    "[{t}] nvidia 0000:{h}:00.0: enabling device (0000 -> 0003)",
    "[{t}] pcieport 0000:{h}:01.0: PME: Signaling with IRQ {n}",
    "[{t}] perf: interrupt took too long ({n} > 2500), lowering kernel.perf_event_max_sample_rate",
    "[{t}] usb 1-{n}: new high-speed USB device number {n} using xhci_hcd",
    "[{t}] CPU{n}: Core temperature above threshold, cpu clock throttled (total events = {n})",
    "[{t}] kauditd_printk_skb: {n} callbacks suppressed",
    "[{t}] docker0: port {n}(veth{h}) entered forwarding state",
    "Jul 09 10:42:{s} node-{n} kernel: [{t}] IPVS: rr: TCP 10.0.0.{n}:443 - no destination",
    "Jul 09 10:42:{s} node-{n} systemd[1]: Started session-{n}.scope - Session {n} of user ops.",
    "6,{n},{n},-;nvme nvme{n}: I/O {n} QID {n} timeout, completion polled",
    "4,{n},{n},-;TCP: request_sock_TCP: Possible SYN flooding on port {n}. Sending cookies.",
)


def _fill(template: str, rng: random.Random) -> str:
    return template.format(
        t=f"{rng.uniform(0, 9_000_000):14.6f}",
        n=rng.randrange(1, 70_000),
        h=f"{rng.randrange(256):02x}",
        s=f"{rng.randrange(60):02d}",
    )


def corpus_lines() -> tuple[list[str], list[str]]:
    """(fault lines, noise lines) of the shared corpus."""
    with CORPUS.open(newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream, delimiter="\t", quoting=csv.QUOTE_NONE))
    faults = [row["line"] for row in rows if row["expected_kind"] != "noise"]
    noise = [row["line"] for row in rows if row["expected_kind"] == "noise"]
    return faults, noise


def build_mix(count: int, fault_share: float, seed: int = 7) -> list[str]:
    rng = random.Random(seed)  # the same mix on every run
    faults, corpus_noise = corpus_lines()
    lines = []
    for _ in range(count):
        if rng.random() < fault_share:
            lines.append(rng.choice(faults))
        elif rng.random() < 0.1:  # a tenth of the noise is the corpus's own
            lines.append(rng.choice(corpus_noise))
        else:
            lines.append(_fill(rng.choice(NOISE_TEMPLATES), rng))
    return lines


def lines_per_second(lines: list[str], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for line in lines:
            parse_message(line)
        best = min(best, time.perf_counter() - started)
    return len(lines) / best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--fault-share", type=float, default=0.02)
    parser.add_argument("--repeat", type=int, default=5, help="best of this many passes")
    args = parser.parse_args()
    if not CORPUS.exists():
        print(f"bench/parse.py: the corpus {CORPUS} is missing", file=sys.stderr)
        return 2
    mix = build_mix(args.lines, args.fault_share)
    rate = lines_per_second(mix, args.repeat)
    ok = rate >= TARGET_LINES_PER_SECOND
    print("| benchmark | lines | fault lines | lines/s (one core) | target |")
    print("|---|---|---|---|---|")
    print(
        f"| parse_message, realistic mix | {len(mix):,} | {args.fault_share:.0%} "
        f"| {rate:,.0f} | ≥ {TARGET_LINES_PER_SECOND:,} {'ok' if ok else 'MISSED'} |"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
