#!/usr/bin/env python3
"""Print how much of each ELF section of a running binary is resident.

usage: sudo hack/resident-sections.py [--packages[=N]] PID [BINARY]

For every allocated section of BINARY (default: /proc/PID/exe), counts the
pages of its address range that /proc/PID/pagemap reports present in the
process's page tables, which is what RSS counts (RssFile for the read-only
sections, RssAnon for written .data/.bss pages). Reading pagemap needs root.
docs/benchmarks.md uses it to show where a Go binary's file-backed RSS comes
from.

--packages also splits the resident part of .text by Go module or package (the
first three path elements for k8s.io/, github.com/, golang.org/ and similar,
the first one for the standard library), from the symbol table that
`go tool nm -size` reads, and prints the N largest (default 25): which
libraries' code the process has run, or that sits within fault-around of it.
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


def present_pages(pagemap, first, last):
    """The set of page numbers in [first, last] present in the page tables."""
    pagemap.seek(first * 8)
    data = pagemap.read((last - first + 1) * 8)
    return {first + i for i, (entry,) in enumerate(struct.iter_unpack("<Q", data)) if entry >> 63}


def package_of(symbol):
    if symbol.startswith(("type:", "go:", "runtime.", "internal/")):
        return symbol.split(".")[0].split(":")[0]
    # The package path ends at the first dot after the last slash before any
    # bracket (generic instantiations name other packages inside brackets).
    head = symbol.split("[", 1)[0]
    slash = head.rfind("/")
    dot = head.find(".", slash + 1)
    path = head[:dot] if dot > 0 else head
    parts = path.split("/")
    if "." in parts[0]:
        return "/".join(parts[:3])
    return parts[0]


def packages(pid, binary, top):
    text = next(((addr, size) for name, addr, size in sections(binary) if name == ".text"), None)
    if text is None:
        sys.exit(f"{binary}: no .text section")
    addr, size = text
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        present = present_pages(pagemap, addr // PAGE, (addr + size - 1) // PAGE)
    nm = subprocess.run(["go", "tool", "nm", "-size", binary], capture_output=True, text=True)
    if nm.returncode != 0:
        print(f"\n{binary}: no Go symbol table (stripped?): {nm.stderr.strip()}")
        return
    out = nm.stdout
    resident, linked = {}, {}
    for line in out.splitlines():
        f = line.split(None, 3)
        if len(f) < 4 or f[2] not in ("T", "t"):
            continue
        start, length, pkg = int(f[0], 16), int(f[1]), package_of(f[3])
        linked[pkg] = linked.get(pkg, 0) + length
        pages = range(start // PAGE, (start + max(length, 1) - 1) // PAGE + 1)
        share = sum(1 for pg in pages if pg in present) / len(pages)
        resident[pkg] = resident.get(pkg, 0) + length * share
    print(f"\n.text resident by package (of {len(present) * PAGE / 2**20:.1f} MiB):")
    for pkg, n in sorted(resident.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {n / 2**20:6.2f} MiB of {linked[pkg] / 2**20:6.2f}  {pkg}")


def main():
    args = sys.argv[1:]
    top = 0
    if args and args[0].startswith("--packages"):
        top = int(args[0].partition("=")[2] or 25)
        args = args[1:]
    if len(args) not in (1, 2):
        sys.exit(__doc__)
    pid = args[0]
    binary = args[1] if len(args) == 2 else os.readlink(f"/proc/{pid}/exe")
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
    if top:
        packages(pid, binary, top)


if __name__ == "__main__":
    main()
