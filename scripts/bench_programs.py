#!/usr/bin/env python3
"""Real programs on the Moneta file system, direct path against kernel path
(issue 4, README "Unmodified programs"): fio 512 B / 4 KiB random reads and
writes, SQLite transactions, Berkeley DB transactions, each through
`moneta run` (libmoneta_preload.so → channel → emulated Moneta-D) and
through the kernel on the same mount (XFS on a loop device over the same
image), in one run. Prints a table and writes JSON.

    python3 scripts/bench_programs.py [--seconds 3] [--json out/programs.json]

Needs root (it runs `moneta up` / `moneta down`), fio, sqlite3, gcc and
libdb5.3-dev (`make setup` installs them).
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MONETA = os.path.join(ROOT, "target", "release", "moneta")


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"bench_programs: {' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def fio(prefix, path, rw, bs, seconds, direct):
    out = run(prefix + [
        "fio", "--name=bench", f"--filename={path}", "--ioengine=psync",
        f"--rw={rw}", f"--bs={bs}", "--size=256m", "--randrepeat=1",
        f"--runtime={seconds}", "--time_based", f"--direct={int(direct)}",
        "--output-format=json",
    ])
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["read"] if rw == "randread" else job["write"]
    return {"iops": side["iops"], "latency_us_mean": side["clat_ns"]["mean"] / 1e3}


def sqlite_scripts(rows, transactions):
    r = random.Random(7)
    setup = ["CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER, s TEXT);", "BEGIN;"]
    setup += [f"INSERT INTO t VALUES({i},{r.randrange(1 << 30)},'{'x' * r.randrange(10, 100)}');"
              for i in range(rows)]
    setup.append("COMMIT;")
    updates = []
    for _ in range(transactions):
        updates.append("BEGIN;")
        updates += [f"UPDATE t SET v={r.randrange(1 << 30)} WHERE id={r.randrange(rows)};"
                    for _ in range(5)]
        updates.append("COMMIT;")
    updates.append("PRAGMA integrity_check;")
    return "\n".join(setup) + "\n", "\n".join(updates) + "\n"


def sqlite(prefix, db, setup, updates, transactions):
    subprocess.run(prefix + ["sqlite3", db], input=setup, text=True, check=True,
                   capture_output=True)
    t0 = time.monotonic()
    out = subprocess.run(prefix + ["sqlite3", db], input=updates, text=True, check=True,
                         capture_output=True).stdout
    seconds = time.monotonic() - t0
    if out.strip() != "ok":
        sys.exit(f"bench_programs: sqlite integrity check said {out!r}")
    return {"transactions_per_s": transactions / seconds}


def bdb(prefix, program, directory, kind, transactions):
    os.makedirs(directory)
    out = run(prefix + [program, directory, kind, "20000", str(transactions), "1"])
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--preset", default="moneta-d")
    a = ap.parse_args()
    mount = tempfile.mkdtemp(prefix="moneta-bench-")
    run([MONETA, "up", "--mount", mount, "--size", "2G", "--preset", a.preset])
    try:
        shim = [MONETA, "run", "--mount", mount, "--"]
        results = {"preset": a.preset, "fio": [], "sqlite": {}, "bdb": {}}
        data = os.path.join(mount, "fio.dat")
        run(["fio", "--name=layout", f"--filename={data}", "--size=256m", "--rw=write",
             "--bs=1m", "--output-format=json"])
        for bs in (512, 4096):
            for rw in ("randread", "randwrite"):
                row = {"bs": bs, "rw": rw,
                       "direct_path": fio(shim, data, rw, bs, a.seconds, False),
                       "kernel_o_direct": fio([], data, rw, bs, a.seconds, True),
                       "kernel_buffered": fio([], data, rw, bs, a.seconds, False)}
                results["fio"].append(row)
        setup, updates = sqlite_scripts(20000, 300)
        results["sqlite"] = {
            "direct_path": sqlite(shim, os.path.join(mount, "d.db"), setup, updates, 300),
            "kernel": sqlite([], os.path.join(mount, "k.db"), setup, updates, 300),
        }
        program = os.path.join(tempfile.gettempdir(), f"bdb_updates-{os.getpid()}")
        run(["gcc", "-O2", "-o", program, os.path.join(ROOT, "examples/bdb/bdb_updates.c"), "-ldb"])
        for kind in ("btree", "hash"):
            d = bdb(shim, program, os.path.join(mount, f"{kind}-d"), kind, 3000)
            k = bdb([], program, os.path.join(mount, f"{kind}-k"), kind, 3000)
            if d["checksum"] != k["checksum"]:
                sys.exit(f"bench_programs: Berkeley DB {kind} contents differ")
            results["bdb"][kind] = {"direct_path": d["transactions_per_s"],
                                    "kernel": k["transactions_per_s"]}
        os.remove(program)
    finally:
        subprocess.run([MONETA, "down", "--purge", "--mount", mount], capture_output=True)
        os.rmdir(mount)

    print(f"preset {a.preset}; fio psync, QD1, 256 MiB file, {a.seconds} s per point")
    print(f"{'':18} {'direct path':>22} {'kernel O_DIRECT':>22} {'kernel buffered':>22}")
    for r in results["fio"]:
        cells = [f"{r[k]['iops']:>9.0f} IOPS {r[k]['latency_us_mean']:>6.2f} µs"
                 for k in ("direct_path", "kernel_o_direct", "kernel_buffered")]
        print(f"fio {r['rw']:<9} {r['bs']:>4} B " + " ".join(f"{c:>22}" for c in cells))
    s = results["sqlite"]
    print(f"sqlite3 transactions/s: direct {s['direct_path']['transactions_per_s']:.0f}, "
          f"kernel {s['kernel']['transactions_per_s']:.0f}")
    for kind, v in results["bdb"].items():
        print(f"Berkeley DB {kind} transactions/s: direct {v['direct_path']:.0f}, kernel {v['kernel']:.0f} "
              f"({v['direct_path'] / v['kernel']:.2f}×)")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
