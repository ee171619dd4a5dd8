#!/usr/bin/env python3
"""Print how much of each ELF section of a running binary is resident.

usage: sudo hack/resident-sections.py PID [BINARY]

For every allocated section of BINARY (default: /proc/PID/exe), counts the
pages of its address range that /proc/PID/pagemap reports present in the
process's page tables, which is what RSS counts (RssFile for the read-only
sections, RssAnon for written .data/.bss pages). Reading pagemap needs root.
docs/benchmarks.md uses it to show where a Go binary's file-backed RSS comes
from.
"""
import os
import re
import struct
import subprocess
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")


def sections(binary):
    out = subprocess.run(["readelf", "-SW", binary], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)", line)
        if m and int(m.group(2), 16):
            yield m.group(1), int(m.group(2), 16), int(m.group(3), 16)


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    pid = sys.argv[1]
    binary = sys.argv[2] if len(sys.argv) == 3 else os.readlink(f"/proc/{pid}/exe")
    total = 0
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for name, addr, size in sections(binary):
            first, last = addr // PAGE, (addr + size - 1) // PAGE
            present = 0
            for page in range(first, last + 1):
                pagemap.seek(page * 8)
                (entry,) = struct.unpack("<Q", pagemap.read(8))
                present += (entry >> 63) & 1
            total += present
            if present * PAGE >= 2**20 // 20:
                print(f"{name:16} {present * PAGE / 2**20:7.1f} MiB resident of {(last - first + 1) * PAGE / 2**20:7.1f} MiB")
    print(f"{'all sections':16} {total * PAGE / 2**20:7.1f} MiB")


if __name__ == "__main__":
    main()
