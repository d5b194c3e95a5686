#!/usr/bin/env python3
"""Checks the documentation (README.md and the mdBook under docs/src) the way
a reader would trip over it, and exits nonzero listing every problem:

- every relative link resolves to a file, and every #anchor to a heading of
  that file (mdBook's heading ids);
- every "SPEC §x.y" resolves to a section of docs/src/design/spec.md;
- every page is reachable from SUMMARY.md;
- README stays a user's README (at most 250 lines);
- user documentation carries no development history: no issue numbers, no
  "pass N" headings, no commit hashes (the SPEC and DESIGN copies, which are
  the project's design documents verbatim, and the provenance line of a
  generated results page are exempt).

Usage: scripts/check_docs.py [REPO_ROOT]
"""

import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
SRC = os.path.join(ROOT, "docs", "src")
README = os.path.join(ROOT, "README.md")
VERBATIM = {"design/spec.md", "design/design.md"}
PROVENANCE = re.compile(r"^<small>moneta \S+ \(commit [0-9a-f]+(-dirty)?\), ")
README_MAX_LINES = 250

HISTORY = [
    (re.compile(r"\b[Ii]ssues? #?\d+\b"), "an issue number"),
    (re.compile(r"^#+ .*\b(pass \d+|(first|second|third|fourth|fifth|sixth|seventh) pass)\b", re.I), "a pass heading"),
    (re.compile(r"\bcommit [0-9a-f]{7,40}\b"), "a commit hash"),
    (re.compile(r"\b(this|last|previous) (session|stop)\b", re.I), "a working note"),
]


def heading_id(text):
    """mdBook's id for a heading: lower case, alphanumerics, '-' and '_' kept,
    spaces to '-', everything else dropped."""
    text = re.sub(r"<[^>]+>", "", text.replace("`", ""))
    out = []
    for ch in text.strip():
        if ch.isalnum() or ch in "_-":
            out.append(ch.lower())
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def markdown_lines(path):
    """(line number, line, inside a code block) for every line of a file."""
    in_code = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
                yield n, line, True
                continue
            yield n, line, in_code


def anchors_of(path):
    ids = {}
    for _, line, code in markdown_lines(path):
        if not code and line.startswith("#"):
            base = heading_id(line.lstrip("#"))
            # mdBook numbers repeated ids: x, x-1, x-2.
            k = ids.get(base, 0)
            ids[base] = k + 1
            if k:
                ids[f"{base}-{k}"] = 1
    return set(ids)


def spec_sections():
    """Every § number the SPEC copy has a heading for ('3', '3.2', '1.9')."""
    found = set()
    path = os.path.join(SRC, "design", "spec.md")
    if not os.path.exists(path):
        return found
    for _, line, code in markdown_lines(path):
        if not code and line.startswith("#"):
            for m in re.finditer(r"§\s*(\d+(?:\.\d+)*)", line):
                found.add(m.group(1))
    return found


def main():
    problems = []
    pages = []
    for d, _, files in os.walk(SRC):
        for name in files:
            if name.endswith(".md"):
                pages.append(os.path.relpath(os.path.join(d, name), SRC))
    anchors = {p: anchors_of(os.path.join(SRC, p)) for p in pages}
    sections = spec_sections()

    summary = os.path.join(SRC, "SUMMARY.md")
    listed = set()
    if os.path.exists(summary):
        for _, line, _ in markdown_lines(summary):
            for m in re.finditer(r"\]\(([^)#\s]+)", line):
                listed.add(os.path.normpath(m.group(1)))
    else:
        problems.append("docs/src/SUMMARY.md is missing")
    for p in pages:
        if p != "SUMMARY.md" and p not in listed:
            problems.append(f"docs/src/{p}: not in SUMMARY.md (no reader can reach it)")

    files = [README] + [os.path.join(SRC, p) for p in pages]
    for path in files:
        rel = os.path.relpath(path, ROOT)
        in_src = path.startswith(SRC + os.sep)
        page = os.path.relpath(path, SRC) if in_src else None
        for n, line, code in markdown_lines(path):
            if code:
                continue
            for m in re.finditer(r"\]\(([^)\s]+)\)", line):
                url = m.group(1)
                if re.match(r"^[a-z]+:", url):
                    continue
                target, _, frag = url.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
                if not os.path.exists(dest):
                    problems.append(f"{rel}:{n}: link to {url}: no such file")
                    continue
                if frag and dest.endswith(".md"):
                    key = os.path.relpath(dest, SRC)
                    ids = anchors.get(key) or anchors_of(dest)
                    if frag not in ids:
                        problems.append(f"{rel}:{n}: link to {url}: no such heading")
            # A generated results page's provenance line names the commit
            # it was made from, on purpose.
            provenance = PROVENANCE.match(line) is not None
            if page not in VERBATIM and not provenance:
                for m in re.finditer(r"SPEC\s+§\s*(\d+(?:\.\d+)*)", line):
                    num = m.group(1)
                    if sections and num not in sections and num.split(".")[0] not in sections:
                        problems.append(f"{rel}:{n}: SPEC §{num} has no section in docs/src/design/spec.md")
                for pattern, what in HISTORY:
                    if pattern.search(line):
                        problems.append(f"{rel}:{n}: {what} in user documentation: {line.strip()[:100]}")

    with open(README, encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    if lines > README_MAX_LINES:
        problems.append(f"README.md: {lines} lines (a user's README has at most {README_MAX_LINES}; move detail into docs/src)")

    for p in problems:
        print(p)
    print(f"check_docs: {len(files)} files, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
