#!/usr/bin/env python3
"""README's issue-23 fidelity table: every visible calibration point, before → after.

    moneta calibrate --format json > after.json        # this tree
    OLD/moneta calibrate --format json > before.json   # a build of the baseline commit
    python3 scripts/fidelity_before_after.py before.json after.json [--nvmm-log LOG]

Prints Markdown, one table per family (grouped by each check's source), with
the published value, the model before and after, the error after, and
whether the check is within its tolerance before and after; then per family
the count within tolerance and the mean absolute percentage error (MAPE) over
the checks with a single published value (range checks are counted, not
averaged; a statement's value inside its range counts as a point). A check
missing from the baseline is "new". Nothing here changes a number: it only
compares two runs of `moneta calibrate`.

Before issue 23 the NVMM statements were a test, not `moneta calibrate`
checks: `--nvmm-log` reads the baseline's values from that test's output
(`cargo test --release -p moneta-model --test nvmm_calibration -- --nocapture`
at the baseline commit), matched to today's checks by name.
"""

import argparse
import json
import re

# Family by the first source marker found in a check's source (order matters:
# the 2011 table is its own family, the rest of chapter 3 another).
FAMILIES = [
    ("Moneta 2011 table (SPEC §2.3, the issue's first family)", ["Moneta 2011 table"]),
    ("Moneta: chapter 3, MICRO'10, the 2011 latencies, HASTE (SPEC §1–§2, §6)",
     ["Table 3.4", "MICRO'10", "Onyx thesis", "SC'10"]),
    ("Moneta-D: chapter 4 (SPEC §3)",
     ["ASPLOS'12", "Table 4.2", "dissertation §4", "dissertation ch. 4"]),
    ("QuickSAN: chapter 5 (SPEC §4)", ["Table 5.1", "dissertation ch. 5", "§5.4.7", "§5.5"]),
    ("NVMM (SPEC §7)", ["NVMM report"]),
]


def checks(doc):
    """The checks of a calibrate JSON document: `{"provenance", "results"}`,
    or the bare list older builds printed (a baseline may be one)."""
    return doc["results"] if isinstance(doc, dict) else doc


def family(source):
    for name, markers in FAMILIES:
        if any(m in source for m in markers):
            return name
    return "other"


def within(check):
    """Whether a check of `moneta calibrate --format json` met its tolerance."""
    sim, pub = check["simulated"], check["published"]
    bounds = check.get("bounds")
    if bounds:
        low, high = bounds
        return (low is None or sim >= low) and (high is None or sim <= high)
    return abs(sim - pub) <= check["tolerance"] * abs(pub)


def error(check):
    return (check["simulated"] - check["published"]) / check["published"]


def is_point(check):
    """A check with one published value: no bounds, or a statement's value
    strictly inside its range (the NVMM report's "3×" checked as 2–4)."""
    bounds = check.get("bounds")
    if not bounds:
        return True
    low, high = bounds
    return low is not None and high is not None and low < check["published"] < high


def number(x):
    if x is None:
        return "—"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.1f}"
    if a >= 10:
        return f"{x:.2f}"
    return f"{x:.3g}"


def published(check):
    bounds = check.get("bounds")
    if bounds:
        low, high = bounds
        if low is None or low == 0:
            return f"< {number(high)}"
        if high is None:
            return f"> {number(low)}"
        if is_point(check):
            return f"{number(check['published'])} ({number(low)} … {number(high)})"
        return f"{number(low)} … {number(high)}"
    return number(check["published"])


def mark(ok):
    return "ok" if ok else "miss"


def nvmm_statement(name):
    """A statement's name without the published value in parentheses at its
    end, as the baseline's test printed it ("... NVMM over SSD (3×)")."""
    name = re.sub(r"\s*\((?:[^()]|\([^()]*\))*\)\s*$", "", name)
    return name.replace("NVMM ≈ SSD", "NVMM over SSD").strip()


def nvmm_before(log_path, after):
    """Today's NVMM checks with the values the baseline's test printed."""
    measured = {}
    with open(log_path) as f:
        for line in f:
            m = re.match(r"^(.*?)\s{2,}measured\s+([-\d.]+)\s+wanted", line)
            if m:
                measured[nvmm_statement(m.group(1))] = (m.group(1).strip(), float(m.group(2)))
    found = {}
    for c in after:
        if "NVMM report" not in c["source"]:
            continue
        key = nvmm_statement(c["name"])
        if key.startswith("MMAP 1 thread at 150"):
            # The test printed NVMM over SSD ("the SSD has passed NVMM" when < 1);
            # the check is its inverse, SSD over NVMM ("passed" when > 1).
            old = [v for k, (_, v) in measured.items() if k.startswith("MMAP 1 thread at 150")]
            value = 1 / old[0] if old else None
        else:
            value = measured.get(key, (None, None))[1]
        if value is not None:
            found[c["name"]] = dict(c, simulated=value)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--nvmm-log", help="the baseline's nvmm_calibration test output")
    args = parser.parse_args()
    with open(args.before) as f:
        before = {c["name"]: c for c in checks(json.load(f))}
    with open(args.after) as f:
        after = checks(json.load(f))
    if args.nvmm_log:
        before.update(nvmm_before(args.nvmm_log, after))
    gone = [name for name in before if name not in {c["name"] for c in after}]
    by_family = {}
    for c in after:
        by_family.setdefault(family(c["source"]), []).append(c)
    summary = []
    for name, _ in FAMILIES + [("other", [])]:
        family_checks = by_family.get(name)
        if not family_checks:
            continue
        print(f"#### {name}\n")
        print("| check | unit | published | before | after | error after | before → after |")
        print("|---|---|---|---|---|---|---|")
        for c in family_checks:
            b = before.get(c["name"])
            if b is None:
                was, status = "new", f"new, {mark(within(c))}"
            else:
                was = number(b["simulated"])
                status = f"{mark(within(b))} → {mark(within(c))}"
            err = f"{error(c) * 100:+.1f}%" if is_point(c) else ""
            print(f"| {c['name']} | {c['unit']} | {published(c)} | {was} | "
                  f"{number(c['simulated'])} | {err} | {status} |")
        print()
        old = [before[c["name"]] for c in family_checks if c["name"] in before]
        points_after = [abs(error(c)) for c in family_checks if is_point(c)]
        points_same = [abs(error(before[c["name"]])) for c in family_checks
                       if c["name"] in before and is_point(c)]
        points_same_after = [abs(error(c)) for c in family_checks
                             if c["name"] in before and is_point(c)]
        summary.append((
            name,
            sum(map(within, old)), len(old),
            sum(map(within, family_checks)), len(family_checks),
            100 * sum(points_same) / len(points_same) if points_same else None,
            100 * sum(points_same_after) / len(points_same_after) if points_same_after else None,
            100 * sum(points_after) / len(points_after) if points_after else None,
        ))
    print("| family | within before | within after | MAPE before → after (checks of both runs) | MAPE after, all point checks |")
    print("|---|---|---|---|---|")
    for name, wb, nb, wa, na, mb, ma, mall in summary:
        pct = lambda m: "—" if m is None else f"{m:.1f}%"
        print(f"| {name} | {wb} of {nb} | {wa} of {na} | {pct(mb)} → {pct(ma)} | {pct(mall)} |")
    if gone:
        print(f"\nChecks of the baseline no longer run: {', '.join(gone)}")


if __name__ == "__main__":
    main()
