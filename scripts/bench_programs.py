#!/usr/bin/env python3
"""Real programs on the Moneta file system, direct path against kernel path
(issues 4, 8 and 11; README "Unmodified programs" and "NBD and the kernel
path"): fio 512 B / 4 KiB random reads and writes, SQLite transactions,
Berkeley DB transactions, and the growth suite of issue 8 (creating and
extending files: fio randwrite on a new sparse file, tar extract, cp into the mount, SQLite with a WAL and with
a rollback journal, pgbench -i), on the same preset, in one run, on these
sides:

- direct path: through `moneta run` (libmoneta_preload.so → channel →
  emulated device), on an instance whose kernel path is the loop device;
- kernel, device timing: plain programs on an instance brought up with
  `--kernel-path device` (loop device with direct I/O over nbdfuse over
  monetad's NBD export: every block the kernel moves pays the device);
- kernel, no timing: plain programs on the first instance (loop device over
  the image: the page cache and memory, no device timing);
- transport alone: plain programs on a `null`-preset instance with
  `--kernel-path device`: what the NBD + FUSE + loop transport costs by
  itself, to read beside the device-timing side.

fio rows also carry the simulator's prediction of the same comparison:
Moneta-D's direct stack against the Moneta kernel stack with a file system
(`moneta sim run --set host.stack=direct` / `host.stack=2q
host.file_system=true`, one thread, QD1). Every direct-path cell also
carries its run's report (`moneta run --report`): the verdict, the share of
the bytes the device served, and whether most of them bypassed it. Prints
tables and writes JSON.

    python3 scripts/bench_programs.py [--seconds 3] [--suites fio,sqlite,bdb,growth]
                                      [--sides direct,device,loop,transport]
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


# Where `moneta run --report` writes the direct side's last run.
REPORT = os.path.join(tempfile.gettempdir(), f"moneta-bench-run-{os.getpid()}.json")


def run_verdict(prefix):
    """The verdict of the last `moneta run` with `prefix` (empty for the
    kernel sides): its verdict, the device's share of the bytes, and the
    bypass warning."""
    if "--report" not in prefix:
        return {}
    try:
        with open(REPORT) as f:
            r = json.load(f)
        os.remove(REPORT)
    except (OSError, ValueError) as e:
        return {"verdict": f"no run report: {e}"}
    # The report file carries its provenance beside the results.
    r = r.get("results", r)
    share = r.get("kernel_share")
    return {"verdict": r["verdict"], "faithful": r["faithful"],
            "device_share": None if share is None else 1.0 - share,
            "mostly_bypassed": r["mostly_bypassed"]}


def fio(prefix, path, rw, bs, seconds, direct):
    out = run(prefix + [
        "fio", "--name=bench", f"--filename={path}", "--ioengine=psync",
        f"--rw={rw}", f"--bs={bs}", "--size=256m", "--randrepeat=1",
        f"--runtime={seconds}", "--time_based", f"--direct={int(direct)}",
        "--output-format=json",
    ])
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["read"] if rw == "randread" else job["write"]
    return {"iops": side["iops"], "latency_us_mean": side["clat_ns"]["mean"] / 1e3,
            **run_verdict(prefix)}


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
    return {"transactions_per_s": transactions / seconds, **run_verdict(prefix)}


def bdb(prefix, program, directory, kind, transactions):
    os.makedirs(directory)
    out = run(prefix + [program, directory, kind, "20000", str(transactions), "1"])
    return {**json.loads(out), **run_verdict(prefix)}


def timed(cmd, **kw):
    t0 = time.monotonic()
    run(cmd, **kw)
    return time.monotonic() - t0


def growth_workloads(work):
    """(name, what it does, a function running it with a command prefix on a
    mount and returning seconds) for the growth suite. Inputs are made once,
    off the mounts."""
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

    def fresh(mount, name):
        d = os.path.join(mount, name)
        subprocess.run(["rm", "-rf", d], check=True)
        os.makedirs(d)
        return d

    def tar(prefix, mount):
        d = fresh(mount, "tar")
        return timed(prefix + ["tar", "-xf", archive, "-C", d])

    def cp(prefix, mount):
        d = fresh(mount, "cp")
        return timed(prefix + ["cp", "-r", tree, big, d])

    def sqlite_script(script):
        def go(prefix, mount):
            d = fresh(mount, "sqlite")
            return timed(prefix + ["sqlite3", os.path.join(d, "g.db")], input=script)
        return go

    def fio_new_file(prefix, mount):
        # A new sparse file (fio sizes it with ftruncate), written at random:
        # growth into holes (1 MiB chunks), no fsync.
        d = fresh(mount, "fio")
        return timed(prefix + ["fio", "--name=g", f"--filename={os.path.join(d, 'f')}",
                               "--rw=randwrite", "--bs=4k", "--size=64m", "--ioengine=psync",
                               "--fallocate=none", "--output-format=terse"])

    workloads = [
        ("fio randwrite, new file", "fio randwrite 4 KiB psync over a new 64 MiB sparse file",
         fio_new_file),
        ("tar extract", f"tar -xf of 2000 files (1-64 KiB, {os.path.getsize(archive) >> 20} MiB)", tar),
        ("cp into the mount", "cp -r of the same tree and a 128 MiB file", cp),
        ("SQLite WAL", f"{inserts} autocommit inserts, journal_mode=WAL", sqlite_script(wal)),
        ("SQLite rollback journal", f"{inserts} autocommit inserts, journal_mode=DELETE",
         sqlite_script(rollback)),
    ]
    pg = postgres_bin()
    if pg:
        workloads.append(("pgbench -i", "pgbench -i -s 8 (server through the shim or not)",
                          lambda prefix, mount: pgbench_init(pg, mount, prefix)))
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


def growth(sides, repeats):
    work = tempfile.mkdtemp(prefix="moneta-growth-")
    try:
        rows = []
        for name, what, go in growth_workloads(work):
            # The 1-minute load average around the row: on a shared machine
            # the direct side's threads wait for a core at every request.
            load = [os.getloadavg()[0]]
            times = {side: [] for side, _, _ in sides}
            verdicts = {}
            for _ in range(repeats):
                # Alternate, so drift on a shared machine hits every side alike.
                for side, prefix, mount in sides:
                    times[side].append(go(prefix, mount))
                    v = run_verdict(prefix)
                    if v:
                        verdicts[side] = v  # the last repeat's
            load.append(os.getloadavg()[0])
            rows.append({"workload": name, "what": what,
                         "seconds": {side: sorted(t)[repeats // 2] for side, t in times.items()},
                         "verdicts": verdicts, "load_average": load})
        return rows
    finally:
        subprocess.run(["rm", "-rf", work], check=True)


def predict(preset, rw, bs):
    """The simulator's QD1 mean latency (µs) of the direct stack and of the
    Moneta kernel stack with a file system, for this fio point."""
    op = "read" if rw == "randread" else "write"
    out = {}
    for name, sets in (("direct", ["host.stack=direct"]),
                       ("kernel", ["host.stack=2q", "host.file_system=true"])):
        cmd = [MONETA, "sim", "run", "--preset", preset, "--op", op, "--size", str(bs),
               "--threads", "1", "--ops", "3000", "--format", "json"]
        for kv in sets:
            cmd += ["--set", kv]
        out[name] = json.loads(run(cmd))["results"]["latency_us_mean"]
    return out


SIDES = {
    "direct": "direct path",
    "device": "kernel, device timing",
    "loop": "kernel, no timing",
    "transport": "transport alone (null)",
}


def print_verdicts(cells):
    """Under a row: each direct-path cell's verdict and device share."""
    for side, c in cells.items():
        if "verdict" not in c:
            continue
        share = c.get("device_share")
        loud = "  MOST OF ITS IO BYPASSED THE DEVICE" if c.get("mostly_bypassed") else ""
        print(f"    {side}: device share "
              + ("-" if share is None else f"{share * 100:.0f}%")
              + f"; verdict: {c['verdict']}{loud}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--preset", default="moneta-d")
    ap.add_argument("--suites", default="fio,sqlite,bdb,growth")
    ap.add_argument("--sides", default="direct,device,loop,transport",
                    help="which of direct, device, loop, transport to run")
    ap.add_argument("--repeats", type=int, default=5, help="growth suite: runs per side (median)")
    a = ap.parse_args()
    suites = set(a.suites.split(","))
    wanted = a.sides.split(",")
    unknown = [w for w in wanted if w not in SIDES]
    if unknown:
        sys.exit(f"bench_programs: unknown side(s) {unknown}; expected some of {list(SIDES)}")
    mounts = {}
    try:
        def bring_up(key, preset, kernel_path):
            m = tempfile.mkdtemp(prefix=f"moneta-bench-{key}-")
            mounts[key] = m
            run([MONETA, "up", "--mount", m, "--size", "2G", "--preset", preset,
                 "--kernel-path", kernel_path])
            return m
        main_mount = bring_up("main", a.preset, "loop") if {"direct", "loop"} & set(wanted) else None
        device_mount = bring_up("device", a.preset, "device") if "device" in wanted else None
        null_mount = bring_up("null", "null", "device") if "transport" in wanted else None
        shim = [MONETA, "run", "--mount", main_mount or "", "--report", REPORT, "--"]
        all_sides = {"direct": (shim, main_mount), "device": ([], device_mount),
                     "loop": ([], main_mount), "transport": ([], null_mount)}
        sides = [(SIDES[w], *all_sides[w]) for w in wanted]
        results = {"preset": a.preset, "sides": [s for s, _, _ in sides], "fio": [],
                   "sqlite": {}, "bdb": {}, "growth": []}
        if "fio" in suites:
            for m in set(m for _, _, m in sides):
                run(["fio", "--name=layout", f"--filename={os.path.join(m, 'fio.dat')}",
                     "--size=256m", "--rw=write", "--bs=1m", "--output-format=json"])
        for bs in (512, 4096) if "fio" in suites else ():
            for rw in ("randread", "randwrite"):
                row = {"bs": bs, "rw": rw, "predicted_us": predict(a.preset, rw, bs)}
                for side, prefix, m in sides:
                    # The kernel sides use O_DIRECT: the page cache would hide the device.
                    row[side] = fio(prefix, os.path.join(m, "fio.dat"), rw, bs, a.seconds,
                                    side != SIDES["direct"])
                results["fio"].append(row)
        if "sqlite" in suites:
            setup, updates = sqlite_scripts(20000, 300)
            results["sqlite"] = {
                side: sqlite(prefix, os.path.join(m, f"s{i}.db"), setup, updates, 300)
                for i, (side, prefix, m) in enumerate(sides)}
        program = os.path.join(tempfile.gettempdir(), f"bdb_updates-{os.getpid()}")
        if "bdb" in suites:
            run(["gcc", "-O2", "-o", program, os.path.join(ROOT, "examples/bdb/bdb_updates.c"),
                 "-ldb"])
        for kind in ("btree", "hash") if "bdb" in suites else ():
            runs = {side: bdb(prefix, program, os.path.join(m, f"{kind}-{i}"), kind, 3000)
                    for i, (side, prefix, m) in enumerate(sides)}
            if len({r["checksum"] for r in runs.values()}) != 1:
                sys.exit(f"bench_programs: Berkeley DB {kind} contents differ between sides")
            results["bdb"][kind] = {
                side: {k: r[k] for k in r if k != "checksum"} for side, r in runs.items()}
        if "bdb" in suites:
            os.remove(program)
        if "growth" in suites:
            results["growth"] = growth(sides, a.repeats)
    finally:
        for m in mounts.values():
            subprocess.run([MONETA, "down", "--purge", "--mount", m], capture_output=True)
            os.rmdir(m)

    names = results["sides"]
    print(f"preset {a.preset}; fio psync QD1 on a 256 MiB file, {a.seconds} s per point; "
          "kernel sides O_DIRECT; mean µs (IOPS)")
    print(f"{'':18}" + "".join(f"{n:>24}" for n in names)
          + f"{'sim: direct':>13}{'sim: kernel+fs':>16}")
    for r in results["fio"]:
        cells = "".join(f"{r[n]['latency_us_mean']:>12.2f} ({r[n]['iops']:>8.0f})" for n in names)
        p = r["predicted_us"]
        print(f"fio {r['rw']:<9} {r['bs']:>4} B{cells}{p['direct']:>13.2f}{p['kernel']:>16.2f}")
        print_verdicts({n: r[n] for n in names})
    if results["sqlite"]:
        print("sqlite3 5-update transactions/s: " + ", ".join(
            f"{n} {v['transactions_per_s']:.0f}" for n, v in results["sqlite"].items()))
        print_verdicts(results["sqlite"])
    for kind, v in results["bdb"].items():
        print(f"Berkeley DB {kind} transactions/s: "
              + ", ".join(f"{n} {t['transactions_per_s']:.0f}" for n, t in v.items()))
        print_verdicts(v)
    if results["growth"]:
        print(f"growth, seconds (median of {a.repeats}, alternating):")
        for g in results["growth"]:
            print(f"  {g['workload']:<26}" + "".join(
                f"  {n} {t:.3f}" for n, t in g["seconds"].items()) + f"   ({g['what']}; load "
                + " -> ".join(f"{x:.1f}" for x in g["load_average"]) + ")")
            print_verdicts(g["verdicts"])
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)

if __name__ == "__main__":
    main()
