#!/usr/bin/env python3
"""Real programs on the Moneta file system, direct path against kernel path
(issue 4, README "Unmodified programs"): fio 512 B / 4 KiB random reads and
writes, SQLite transactions, Berkeley DB transactions, and the growth suite
of issue 8 (creating and extending files: tar extract, cp into the mount,
SQLite with a WAL and with a rollback journal), each through `moneta run`
(libmoneta_preload.so → channel → emulated Moneta-D) and through the kernel
on the same mount (XFS on a loop device over the same image), in one run.
Prints a table and writes JSON.

    python3 scripts/bench_programs.py [--seconds 3] [--suites fio,sqlite,bdb,growth]
                                      [--json out/programs.json]

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


def timed(cmd, **kw):
    t0 = time.monotonic()
    run(cmd, **kw)
    return time.monotonic() - t0


def growth_workloads(mount, work):
    """(name, what it does, a function running it with a command prefix and
    returning seconds) for the growth suite. Inputs are made once, off the
    mount."""
    r = random.Random(11)
    tree = os.path.join(work, "tree")
    for d in range(20):
        os.makedirs(os.path.join(tree, f"d{d}"))
        for f in range(100):
            with open(os.path.join(tree, f"d{d}", f"f{f}"), "wb") as out:
                out.write(r.randbytes(r.randrange(1, 64) << 10))
    archive = os.path.join(work, "tree.tar")
    run(["tar", "-cf", archive, "-C", work, "tree"])
    big = os.path.join(work, "big")
    with open(big, "wb") as out:
        for _ in range(128):
            out.write(r.randbytes(1 << 20))
    inserts = 2000
    wal = "PRAGMA journal_mode=WAL;\nCREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);\n" + "".join(
        f"INSERT INTO t(v) VALUES('{'x' * 200}');\n" for _ in range(inserts))
    rollback = wal.replace("PRAGMA journal_mode=WAL;", "PRAGMA journal_mode=DELETE;")

    def fresh(name):
        d = os.path.join(mount, name)
        subprocess.run(["rm", "-rf", d], check=True)
        os.makedirs(d)
        return d

    def tar(prefix):
        d = fresh("tar")
        return timed(prefix + ["tar", "-xf", archive, "-C", d])

    def cp(prefix):
        d = fresh("cp")
        return timed(prefix + ["cp", "-r", tree, big, d])

    def sqlite_script(script):
        def go(prefix):
            d = fresh("sqlite")
            return timed(prefix + ["sqlite3", os.path.join(d, "g.db")], input=script)
        return go

    workloads = [
        ("tar extract", f"tar -xf of 2000 files (1-64 KiB, {os.path.getsize(archive) >> 20} MiB)", tar),
        ("cp into the mount", "cp -r of the same tree and a 128 MiB file", cp),
        ("SQLite WAL", f"{inserts} autocommit inserts, journal_mode=WAL", sqlite_script(wal)),
        ("SQLite rollback journal", f"{inserts} autocommit inserts, journal_mode=DELETE",
         sqlite_script(rollback)),
    ]
    pg = postgres_bin()
    if pg:
        workloads.append(("pgbench -i", "pgbench -i -s 8 (server through the shim or not)",
                          lambda prefix: pgbench_init(pg, mount, prefix)))
    return workloads


def postgres_bin():
    """Debian's PostgreSQL binaries, if installed."""
    root = "/usr/lib/postgresql"
    if not os.path.isdir(root):
        return None
    for v in sorted(os.listdir(root), reverse=True):
        b = os.path.join(root, v, "bin")
        if os.path.exists(os.path.join(b, "postgres")):
            return b
    return None


def pgbench_init(bin_dir, mount, prefix):
    """Seconds of `pgbench -i` against a fresh cluster on the mount whose
    server runs with `prefix` (the shim) or without."""
    data = os.path.join(mount, "pgbench-data")
    sockets = tempfile.mkdtemp(prefix="moneta-pgbench-")
    subprocess.run(["rm", "-rf", data], check=True)
    os.makedirs(data)
    for d in (data, sockets):
        run(["chown", "postgres:postgres", d])
    as_pg = ["runuser", "-u", "postgres", "--"]
    run(as_pg + [os.path.join(bin_dir, "initdb"), "-D", data, "--no-sync"])
    run(as_pg + prefix + [os.path.join(bin_dir, "pg_ctl"), "start", "-w", "-D", data, "-l",
                          os.path.join(data, "log"), "-o",
                          f"-k {sockets} -c listen_addresses=''"])
    try:
        return timed(as_pg + [os.path.join(bin_dir, "pgbench"), "-h", sockets, "-i", "-s", "8",
                              "-q", "postgres"])
    finally:
        subprocess.run(as_pg + [os.path.join(bin_dir, "pg_ctl"), "stop", "-m", "fast", "-w",
                                "-D", data], capture_output=True)
        subprocess.run(["rm", "-rf", sockets])


def growth(shim, mount, repeats):
    work = tempfile.mkdtemp(prefix="moneta-growth-")
    try:
        rows = []
        for name, what, go in growth_workloads(mount, work):
            direct, kernel = [], []
            for _ in range(repeats):
                # Alternate, so drift on a shared machine hits both alike.
                direct.append(go(shim))
                kernel.append(go([]))
            d, k = sorted(direct)[repeats // 2], sorted(kernel)[repeats // 2]
            rows.append({"workload": name, "what": what, "direct_path_s": d, "kernel_s": k,
                         "ratio": d / k})
        return rows
    finally:
        subprocess.run(["rm", "-rf", work], check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--preset", default="moneta-d")
    ap.add_argument("--suites", default="fio,sqlite,bdb,growth")
    ap.add_argument("--repeats", type=int, default=5, help="growth suite: runs per side (median)")
    a = ap.parse_args()
    suites = set(a.suites.split(","))
    mount = tempfile.mkdtemp(prefix="moneta-bench-")
    run([MONETA, "up", "--mount", mount, "--size", "2G", "--preset", a.preset])
    try:
        shim = [MONETA, "run", "--mount", mount, "--"]
        results = {"preset": a.preset, "fio": [], "sqlite": {}, "bdb": {}, "growth": []}
        data = os.path.join(mount, "fio.dat")
        if "fio" in suites:
            run(["fio", "--name=layout", f"--filename={data}", "--size=256m", "--rw=write",
                 "--bs=1m", "--output-format=json"])
        for bs in (512, 4096) if "fio" in suites else ():
            for rw in ("randread", "randwrite"):
                row = {"bs": bs, "rw": rw,
                       "direct_path": fio(shim, data, rw, bs, a.seconds, False),
                       "kernel_o_direct": fio([], data, rw, bs, a.seconds, True),
                       "kernel_buffered": fio([], data, rw, bs, a.seconds, False)}
                results["fio"].append(row)
        if "sqlite" in suites:
            setup, updates = sqlite_scripts(20000, 300)
            results["sqlite"] = {
                "direct_path": sqlite(shim, os.path.join(mount, "d.db"), setup, updates, 300),
                "kernel": sqlite([], os.path.join(mount, "k.db"), setup, updates, 300),
            }
        program = os.path.join(tempfile.gettempdir(), f"bdb_updates-{os.getpid()}")
        if "bdb" in suites:
            run(["gcc", "-O2", "-o", program, os.path.join(ROOT, "examples/bdb/bdb_updates.c"),
                 "-ldb"])
        for kind in ("btree", "hash") if "bdb" in suites else ():
            d = bdb(shim, program, os.path.join(mount, f"{kind}-d"), kind, 3000)
            k = bdb([], program, os.path.join(mount, f"{kind}-k"), kind, 3000)
            if d["checksum"] != k["checksum"]:
                sys.exit(f"bench_programs: Berkeley DB {kind} contents differ")
            results["bdb"][kind] = {"direct_path": d["transactions_per_s"],
                                    "kernel": k["transactions_per_s"]}
        if "bdb" in suites:
            os.remove(program)
        if "growth" in suites:
            results["growth"] = growth(shim, mount, a.repeats)
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
    if s:
        print(f"sqlite3 transactions/s: direct {s['direct_path']['transactions_per_s']:.0f}, "
              f"kernel {s['kernel']['transactions_per_s']:.0f}")
    for kind, v in results["bdb"].items():
        print(f"Berkeley DB {kind} transactions/s: direct {v['direct_path']:.0f}, kernel {v['kernel']:.0f} "
              f"({v['direct_path'] / v['kernel']:.2f}×)")
    if results["growth"]:
        print(f"growth (median of {a.repeats}, alternating): {'direct path':>12} {'kernel':>9} {'ratio':>7}")
        for g in results["growth"]:
            print(f"  {g['workload']:<28} {g['direct_path_s']:>10.3f} s {g['kernel_s']:>7.3f} s "
                  f"{g['ratio']:>6.2f}×   ({g['what']})")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
