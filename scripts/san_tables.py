#!/usr/bin/env python3
"""README's QuickSAN prediction tables from `make san`'s JSON (out/san/*.json).

    make san && python3 scripts/san_tables.py [DIR]
    python3 scripts/san_tables.py --compare BEFORE_DIR AFTER_DIR

Prints Markdown: latency (Table 5.2 layout, with our block transport beside
Table 5.1's), bandwidth per host with the ratio to iSCSI (distributed and
centralized), scaling, replication, sort and energy. The numbers are the
model's predictions; nothing here changes them. DIR (default out/san) holds
the JSON files `make san` writes. With --compare, two such directories (from
two builds, e.g. before and after a model change) give one table of every
prediction that moved by more than 0.5%, and a count of those that did not.
"""

import json
import os
import sys

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "out", "san")
IFACES = ["iscsi", "fibre-channel", "quicksan-os", "quicksan-d"]


def load(name, out=None):
    path = os.path.join(out or OUT, f"{name}.json")
    if not os.path.exists(path):
        sys.exit(f"san_tables: {path} is missing; run `make san` first")
    with open(path) as f:
        return json.load(f)["results"]


def latency():
    rows = load("latency")
    print("| interface | local read | local write | remote read | remote write | our block transport, remote R / W | Table 5.1 block transport R / W |")
    print("|---|---|---|---|---|---|---|")
    for i in IFACES:
        r = {(x["locality"], x["op"]): x for x in rows
             if x["interface"] == i and x["topology"] == "distributed"}
        cells = [f"{r[(loc, op)]['latency_us_mean']:.1f}"
                 for loc in ("local", "remote") for op in ("read", "write")]
        ours = " / ".join(f"{r[('remote', op)]['table_5_1']['block_transport_us']:.1f}"
                          for op in ("read", "write"))
        paper = " / ".join(f"{r[('remote', op)]['table_5_1']['paper_block_transport_us']:.1f}"
                           for op in ("read", "write"))
        print(f"| {i} | " + " | ".join(cells) + f" | {ours} | {paper} |")


def bandwidth(name, label):
    rows = load(name)
    sizes = [512, 4096, 262144]
    ops = ["read", "write", "mixed"]
    names = {"read": "read", "write": "write", "mixed": "50/50"}
    size_name = {512: "512 B", 4096: "4 KB", 262144: "256 KB"}
    cols = [(s, o) for s in sizes for o in ops
            if any(x["size_bytes"] == s and x["op"] == o for x in rows)]
    print(f"| {label}: MB/s per host (× iSCSI) | "
          + " | ".join(f"{size_name[s]} {names[o]}" for s, o in cols) + " |")
    print("|---|" + "---|" * len(cols))
    get = {(x["interface"], x["size_bytes"], x["op"]): x["mb_per_s_per_host"] for x in rows}
    for i in IFACES:
        cells = []
        for s, o in cols:
            v = get[(i, s, o)]
            base = get[("iscsi", s, o)]
            cells.append(f"{v:.1f}" if i == "iscsi" else f"{v:.1f} ({v / base:.1f}×)")
        print(f"| {i} | " + " | ".join(cells) + " |")


def scaling():
    rows = load("scaling")
    print("| nodes | local MB/s | network MB/s | total MB/s |")
    print("|---|---|---|---|")
    by = {}
    for x in rows:
        by[x["nodes"]] = x
        print(f"| {x['nodes']} | {x['local_mb_per_s']:.0f} | {x['network_mb_per_s']:.0f} | {x['total_mb_per_s']:.0f} |")
    if 2 in by:
        for n in (8, 16):
            if n in by:
                print(f"\n2→{n}: total ×{by[n]['total_mb_per_s'] / by[2]['total_mb_per_s']:.2f}, "
                      f"network ×{by[n]['network_mb_per_s'] / by[2]['network_mb_per_s']:.2f}")


def replication():
    rows = load("replication")
    print("| interface, op | latency µs off → on | MB/s per host off → on |")
    print("|---|---|---|")
    get = {(x["interface"], x["op"], x["mirroring"]): x for x in rows}
    for i in ("quicksan-d", "quicksan-os"):
        for op in ("read", "write", "mixed"):
            off, on = get.get((i, op, False)), get.get((i, op, True))
            if not off or not on:
                continue
            dl = on["latency_us_mean"] - off["latency_us_mean"]
            db = on["mb_per_s_per_host"] / off["mb_per_s_per_host"] - 1
            print(f"| {i} {op} | {off['latency_us_mean']:.1f} → {on['latency_us_mean']:.1f} ({dl:+.1f}) "
                  f"| {off['mb_per_s_per_host']:.0f} → {on['mb_per_s_per_host']:.0f} ({db:+.0%}) |")


def sort():
    rows = load("sort")
    print("| topology | interface | stage 1 IO / CPU s | stage 2 IO / CPU s | total s | speedup vs iSCSI |")
    print("|---|---|---|---|---|---|")
    for x in rows:
        print(f"| {x['topology']} | {x['interface']} | {x['stage1']['io_s']:.3f} / {x['stage1']['cpu_s']:.3f} "
              f"| {x['stage2']['io_s']:.3f} / {x['stage2']['cpu_s']:.3f} | {x['total_s']:.3f} "
              f"| {x['speedup_vs_iscsi']:.2f}× |")
    print(f"\nCPU: {rows[0]['cpu_source']}.")


def energy():
    rows = load("energy")
    get = {(x["interface"], x["op"]): x for x in rows}
    print("| interface | J per 4 KB read | write | 50/50 | host CPU busy (read) | iSCSI ÷ this (read / write / 50/50) |")
    print("|---|---|---|---|---|---|")
    for i in IFACES:
        if (i, "read") not in get:
            continue
        mj = [get[(i, o)]["joules_per_op"] * 1e3 for o in ("read", "write", "mixed")]
        ratio = [get[("iscsi", o)]["joules_per_op"] / get[(i, o)]["joules_per_op"]
                 for o in ("read", "write", "mixed")]
        print(f"| {i} | {mj[0]:.2f} mJ | {mj[1]:.2f} mJ | {mj[2]:.2f} mJ "
              f"| {get[(i, 'read')]['host_cpu_utilization']:.2f} | "
              + " / ".join(f"{r:.1f}×" for r in ratio) + " |")


# The experiment files, the fields that name a row, and the predictions compared.
COMPARED = [
    ("latency", ["interface", "topology", "locality", "op"], ["latency_us_mean"]),
    ("bw_dist", ["interface", "op", "size_bytes"], ["mb_per_s_per_host"]),
    ("bw_central", ["interface", "op", "size_bytes"], ["mb_per_s_per_host"]),
    ("scaling", ["interface", "nodes"], ["local_mb_per_s", "network_mb_per_s", "total_mb_per_s"]),
    ("replication", ["interface", "mirroring", "op"], ["latency_us_mean", "mb_per_s_per_host"]),
    ("energy", ["interface", "op"], ["joules_per_op"]),
    ("sort", ["topology", "interface"], ["total_s", "speedup_vs_iscsi"]),
]


def compare(before_dir, after_dir):
    print("| experiment | row | prediction | before | after | change |")
    print("|---|---|---|---|---|---|")
    same = 0
    for name, keys, fields in COMPARED:
        before = {tuple(str(x[k]) for k in keys): x for x in load(name, before_dir)}
        for x in load(name, after_dir):
            row = tuple(str(x[k]) for k in keys)
            b = before.get(row)
            for field in fields:
                if b is None:
                    print(f"| {name} | {' '.join(row)} | {field} | new | {x[field]:.4g} | |")
                    continue
                old, new = b[field], x[field]
                if old == new or (old and abs(new / old - 1) <= 0.005):
                    same += 1
                    continue
                change = f"{(new / old - 1) * 100:+.1f}%" if old else ""
                print(f"| {name} | {' '.join(row)} | {field} | {old:.4g} | {new:.4g} | {change} |")
    print(f"\n{same} other predictions moved by at most 0.5%.")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) == 2:
        global OUT
        OUT = sys.argv[1]
    elif len(sys.argv) != 1:
        sys.exit(__doc__)
    for title, f in (("Latency", latency),
                     ("Bandwidth, distributed", lambda: bandwidth("bw_dist", "distributed")),
                     ("Bandwidth, centralized", lambda: bandwidth("bw_central", "centralized")),
                     ("Scaling", scaling), ("Replication", replication), ("Sort", sort),
                     ("Energy", energy)):
        print(f"### {title}\n")
        f()
        print()


if __name__ == "__main__":
    main()
