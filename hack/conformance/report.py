#!/usr/bin/env python3
"""Turns a Ginkgo JSON report of e2e.test into the result section of docs/conformance.md.

usage: report.py SCOPE_JSON RUN_JSON SKIP_TXT DOC MARKER HEADER_FILE

SCOPE_JSON is the JSON report of a dry run with the focus alone (every spec in scope),
RUN_JSON the report of the real run (absent when the run never started). Each spec in
scope gets one row: passed, failed (with the first line of the failure), skipped (with
skip.txt's reason, or the test's own skip message) or "not run" (the run stopped first).
The rows replace the text between "<!-- MARKER:begin -->" and "<!-- MARKER:end -->" in DOC,
after HEADER_FILE's text (date, versions, command). Prints the summary line.
"""
import json
import os
import re
import sys


def full_name(spec):
    parts = [t for t in spec.get("ContainerHierarchyTexts") or [] if t]
    if spec.get("LeafNodeText"):
        parts.append(spec["LeafNodeText"])
    return " ".join(parts)


def specs(path):
    """The It specs of a Ginkgo JSON report, by full name."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        suites = json.load(f)
    out = {}
    for suite in suites:
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It":
                continue
            out[full_name(spec)] = spec
    return out


def skip_rules(path):
    rules = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if " # " not in line:
                sys.exit(f"report.py: {path}:{n}: a skip needs a reason after ' # '")
            pattern, reason = line.rsplit(" # ", 1)
            rules.append((re.compile(pattern.strip()), reason.strip()))
    return rules


def first_line(text, limit=160):
    text = " ".join((text or "").strip().splitlines()[:1])
    text = text.replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def main():
    scope_json, run_json, skip_txt, doc, marker, header_file = sys.argv[1:7]
    # In scope: what the dry run with the focus alone would run (not filtered out).
    scope = [name for name, s in specs(scope_json).items() if s.get("State") == "passed"]
    run = specs(run_json)
    rules = skip_rules(skip_txt)

    rows, counts = [], {"passed": 0, "failed": 0, "skipped": 0, "not run": 0}
    for name in sorted(scope):
        reason = next((r for p, r in rules if p.search(name)), None)
        spec = run.get(name)
        state = spec.get("State") if spec else None
        if reason is not None:
            status, note = "skipped", reason
        elif state == "passed":
            status, note = "passed", f"{spec.get('RunTime', 0) / 1e9:.0f} s"
        elif state in ("failed", "panicked", "timedout", "interrupted", "aborted"):
            status, note = "failed", first_line((spec.get("Failure") or {}).get("Message"))
        elif state == "skipped" and (spec.get("Failure") or {}).get("Message"):
            status, note = "skipped", "the test skipped itself: " + first_line(spec["Failure"]["Message"])
        else:
            status, note = "not run", "outside this run's selection" if run else "the run did not start"
        counts[status] += 1
        cell = name.replace("|", "\\|")
        rows.append(f"| {cell} | {status} | {note} |")

    total = len(scope)
    summary = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped of {total}"
    if counts["not run"]:
        summary += f" ({counts['not run']} not run)"
    with open(header_file) as f:
        header = f.read().rstrip("\n")
    section = "\n".join([header, "", f"**{summary}**", "", "| Test | Result | Note |", "|---|---|---|", *rows])

    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    text = open(doc).read() if os.path.exists(doc) else ""
    if begin in text and end in text:
        pre, rest = text.split(begin, 1)
        _, post = rest.split(end, 1)
        text = f"{pre}{begin}\n{section}\n{end}{post}"
    else:
        text = f"{text.rstrip()}\n\n{begin}\n{section}\n{end}\n"
    with open(doc, "w") as f:
        f.write(text)
    print(summary)


if __name__ == "__main__":
    main()
