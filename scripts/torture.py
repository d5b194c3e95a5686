#!/usr/bin/env python3
"""Randomized torture test of the direct path (issue 8): several processes,
some through the shim (`moneta run`) and some plain, do random creates,
writes, pwrites, appends, truncates, hole punches, O_DIRECT writes, reads,
mmaps, forks and unlinks on a small set of files on a Moneta mount. Every
written 32-byte unit carries (magic, name, generation, version, offset,
pid), so a unit found in the wrong file is attributed at once.

Operations are serialized by a lock file outside the mount, and every
writer fsyncs before it unlocks: under the coherency rule (README,
"Direct-path semantics") every later operation of every process then sees
the write. So the result is fully determined: a checker replays the log
into a model of POSIX semantics and compares every read, and at the end
every file's bytes (read plainly after dropping the page cache), and looks
for any unit stamped with another file's identity.

    python3 scripts/torture.py --mount M [--workers 4] [--ops 200] [--seed S]
                               [--moneta target/release/moneta]

Prints the seed first; the same seed gives the same operation choices
(interleaving may differ). Exit code 0: no violation. Needs root (drops the
page cache) and a mount made with `moneta up`.
"""

import argparse
import ctypes
import fcntl
import hashlib
import json
import mmap
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

NAMES = ["f0", "f1", "f2", "f3"]
UNIT = 32
MAGIC = b"MNTA"
MAX_SIZE = 1 << 20
FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2


def stamp(name, gen, version, offset, length, pid):
    """Bytes for [offset, offset + length): whole units, cut at the ends."""
    first = offset // UNIT * UNIT
    out = bytearray()
    for at in range(first, offset + length, UNIT):
        out += struct.pack("<4sIIIQQ", MAGIC, NAMES.index(name), gen, version, at, pid)
    skip = offset - first
    return bytes(out[skip:skip + length])


def digest(b):
    return hashlib.sha1(b).hexdigest()


# ---- worker -------------------------------------------------------------------

class Worker:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(f"{a.seed}/{a.index}")
        self.fds = {}  # name -> (fd, gen)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.log = open(a.log, "a")
        self.lock = open(a.lockfile, "a+")
        # What each read returned, so a violation can say whose bytes
        # came back (one file per worker, outside the mount).
        self.reads = open(f"{a.log}.reads.{a.index}", "ab")

    def gen_of(self, name):
        state = json.load(open(self.a.state))
        return state[name]

    def bump_gen(self, name):
        state = json.load(open(self.a.state))
        state[name] += 1
        with open(self.a.state + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(self.a.state + ".tmp", self.a.state)
        return state[name]

    def path(self, name):
        return os.path.join(self.a.mount, name)

    def fd(self, name):
        if name not in self.fds:
            fd = os.open(self.path(name), os.O_RDWR | os.O_CREAT, 0o644)
            self.fds[name] = (fd, self.gen_of(name))
        return self.fds[name]

    def record(self, **kw):
        kw["worker"] = self.a.index
        kw["shim"] = self.a.shim
        kw.setdefault("pid", os.getpid())
        self.log.write(json.dumps(kw) + "\n")
        self.log.flush()

    def keep(self, data):
        at = self.reads.tell()
        self.reads.write(data)
        self.reads.flush()
        return at

    def run(self):
        for i in range(self.a.ops):
            fcntl.flock(self.lock, fcntl.LOCK_EX)
            try:
                self.one(i)
            finally:
                fcntl.flock(self.lock, fcntl.LOCK_UN)

    def one(self, i):
        r = self.rng
        name = r.choice(NAMES)
        op = r.choices(
            ["pwrite", "write", "append", "read", "pread", "truncate", "punch", "odirect",
             "mmap", "fork", "unlink", "reopen"],
            weights=[20, 8, 6, 14, 14, 5, 5, 4, 6, 4, 2, 4])[0]
        version = self.a.index * 1_000_000 + i
        if op == "unlink":
            if name in self.fds:
                # This worker's descriptor goes on naming the old file.
                pass
            try:
                os.unlink(self.path(name))
            except FileNotFoundError:
                pass
            gen = self.bump_gen(name)
            fd = os.open(self.path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            os.fsync(fd)
            old = self.fds.pop(name, None)
            if old:
                os.close(old[0])
            self.fds[name] = (fd, gen)
            self.record(op="unlink", name=name, gen=gen)
            return
        if op == "reopen":
            old = self.fds.pop(name, None)
            if old:
                os.close(old[0])
            fd, gen = self.fd(name)
            self.record(op="reopen", name=name, gen=gen)
            return
        fd, gen = self.fd(name)
        size = os.fstat(fd).st_size
        off = r.randrange(0, MAX_SIZE)
        length = r.randrange(1, 64 << 10)
        if op == "pwrite":
            data = stamp(name, gen, version, off, length, os.getpid())
            n = os.pwrite(fd, data, off)
            os.fsync(fd)
            self.record(op="write", name=name, gen=gen, off=off, len=n, version=version)
        elif op == "write":
            os.lseek(fd, off, os.SEEK_SET)
            data = stamp(name, gen, version, off, length, os.getpid())
            n = os.write(fd, data)
            pos = os.lseek(fd, 0, os.SEEK_CUR)
            os.fsync(fd)
            self.record(op="write", name=name, gen=gen, off=off, len=n, version=version,
                        pos=pos)
        elif op == "append":
            gen = self.gen_of(name)
            afd = os.open(self.path(name), os.O_WRONLY | os.O_APPEND)
            at = os.fstat(afd).st_size
            data = stamp(name, gen, version, at, length, os.getpid())
            n = os.write(afd, data)
            os.fsync(afd)
            os.close(afd)
            self.record(op="write", name=name, gen=gen, off=at, len=n, version=version)
        elif op in ("read", "pread"):
            if op == "read":
                os.lseek(fd, off, os.SEEK_SET)
                data = os.read(fd, length)
            else:
                data = os.pread(fd, length, off)
            self.record(op="read", name=name, gen=gen, off=off, len=length,
                        got=len(data), sha=digest(data), at=self.keep(data))
        elif op == "truncate":
            to = r.randrange(0, MAX_SIZE)
            os.ftruncate(fd, to)
            os.fsync(fd)
            self.record(op="truncate", name=name, gen=gen, to=to)
        elif op == "punch":
            ret = self.libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                      ctypes.c_long(off), ctypes.c_long(length))
            if ret != 0:
                raise OSError(ctypes.get_errno(), "fallocate")
            os.fsync(fd)
            self.record(op="punch", name=name, gen=gen, off=off, len=length)
        elif op == "odirect":
            gen = self.gen_of(name)
            off = off // 4096 * 4096
            length = (length + 4095) // 4096 * 4096
            buf = mmap.mmap(-1, length)
            buf.write(stamp(name, gen, version, off, length, os.getpid()))
            dfd = os.open(self.path(name), os.O_RDWR | os.O_DIRECT)
            n = os.pwrite(dfd, buf, off)
            os.fsync(dfd)
            os.close(dfd)
            self.record(op="write", name=name, gen=gen, off=off, len=n, version=version)
        elif op == "mmap":
            if size == 0:
                self.record(op="noop")
                return
            m = mmap.mmap(fd, size)
            at = r.randrange(0, size)
            n = min(r.randrange(1, 4096), size - at)
            seen = m[at:at + n]
            data = stamp(name, gen, version, at, n, os.getpid())
            m[at:at + n] = data
            m.flush()
            m.close()
            os.fsync(fd)
            self.record(op="read", name=name, gen=gen, off=at, len=n, got=len(seen),
                        sha=digest(seen), at=self.keep(seen))
            self.record(op="write", name=name, gen=gen, off=at, len=n, version=version)
        elif op == "fork":
            os.lseek(fd, off, os.SEEK_SET)
            child_len = r.randrange(1, 8192)
            child_version = version + 500_000
            pid = os.fork()
            if pid == 0:
                try:
                    data = stamp(name, gen, child_version, off, child_len, os.getpid())
                    os.write(fd, data)
                    os.fsync(fd)
                    os._exit(0)
                except BaseException:
                    os._exit(1)
            _, status = os.waitpid(pid, 0)
            if status != 0:
                raise RuntimeError(f"forked child failed ({status})")
            pos = os.lseek(fd, 0, os.SEEK_CUR)
            self.record(op="write", name=name, gen=gen, off=off, len=child_len,
                        version=child_version, child=True, pid=pid)
            data = stamp(name, gen, version, pos, length, os.getpid())
            n = os.write(fd, data)
            os.fsync(fd)
            self.record(op="write", name=name, gen=gen, off=pos, len=n, version=version,
                        shared_offset=pos, expected_offset=off + child_len)


# ---- model and checker --------------------------------------------------------

def describe(unit):
    if unit[:4] != MAGIC:
        return "zeros" if not any(unit) else f"unstamped {unit[:8].hex()}"
    _, idx, gen, version, offset, pid = struct.unpack("<4sIIIQQ", unit)
    name = NAMES[idx] if idx < len(NAMES) else f"#{idx}"
    return f"{name} gen {gen} version {version} offset {offset} pid {pid}"


def explain(log_path, e, want):
    """Where a read differs from the model, and whose bytes it got."""
    try:
        with open(f"{log_path}.reads.{e['worker']}", "rb") as f:
            f.seek(e["at"])
            got = f.read(e["got"])
    except (OSError, KeyError):
        return "(its bytes were not kept)"
    n = min(len(got), len(want))
    first = next((i for i in range(n) if got[i] != want[i]), n)
    last = next((i for i in range(n - 1, first - 1, -1) if got[i] != want[i]), first)
    at = (e["off"] + first) // UNIT * UNIT - e["off"]
    unit_got = got[max(at, 0):at + UNIT] if at >= 0 else got[:UNIT]
    unit_want = want[max(at, 0):at + UNIT] if at >= 0 else want[:UNIT]
    return (f"file bytes [{e['off'] + first}, {e['off'] + last + 1}) differ; there it got "
            f"{describe(unit_got)}, the model has {describe(unit_want)}")


def check(log_path, mount):
    files = {}  # (name, gen) -> bytearray
    problems = []
    pids = {}
    for lineno, line in enumerate(open(log_path)):
        e = json.loads(line)
        op = e["op"]
        if op == "noop":
            continue
        key = (e.get("name"), e.get("gen"))
        f = files.setdefault(key, bytearray())
        where = f"op {lineno} ({'shim' if e['shim'] else 'plain'} worker {e['worker']})"
        if op == "write":
            end = e["off"] + e["len"]
            if len(f) < end:
                f.extend(b"\0" * (end - len(f)))
            f[e["off"]:end] = stamp(e["name"], e["gen"], e["version"], e["off"], e["len"],
                                   e["pid"])
            if "expected_offset" in e and e["shared_offset"] != e["expected_offset"]:
                problems.append(f"{where}: after the child's write the shared offset is "
                                f"{e['shared_offset']}, not {e['expected_offset']}")
            if "pos" in e and e["pos"] != end:
                problems.append(f"{where}: write() left the offset at {e['pos']}, not {end}")
        elif op == "read":
            want = bytes(f[e["off"]:e["off"] + e["len"]])
            if e["got"] != len(want) or e["sha"] != digest(want):
                problems.append(f"{where}: read of {e['len']} at {e['off']} in {e['name']} "
                                f"gen {e['gen']} returned {e['got']} bytes that differ from "
                                f"the model's {len(want)}: " + explain(log_path, e, want))
        elif op == "truncate":
            if len(f) > e["to"]:
                del f[e["to"]:]
            else:
                f.extend(b"\0" * (e["to"] - len(f)))
        elif op == "punch":
            end = min(e["off"] + e["len"], len(f))
            if e["off"] < end:
                f[e["off"]:end] = b"\0" * (end - e["off"])
        elif op == "unlink":
            files[key] = bytearray()
        pids[e["worker"]] = e["shim"]
    # The files as they are now, read plainly from the medium.
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as d:
        d.write("3")
    state = json.load(open(os.path.join(os.path.dirname(log_path), "state.json")))
    for name in NAMES:
        path = os.path.join(mount, name)
        if not os.path.exists(path):
            continue
        disk = open(path, "rb").read()
        want = bytes(files.get((name, state[name]), b""))
        if disk == want:
            continue
        first = next((i for i in range(min(len(disk), len(want))) if disk[i] != want[i]),
                     min(len(disk), len(want)))
        problems.append(f"end: {name} differs from the model from byte {first} "
                        f"(size {len(disk)}, model {len(want)})")
        # Whose bytes are there instead? A whole unit stamped for another
        # file (or generation) is a protection failure.
        for at in range(first // UNIT * UNIT, len(disk) - UNIT + 1, UNIT):
            unit = disk[at:at + UNIT]
            if unit == want[at:at + UNIT] or unit[:4] != MAGIC:
                continue
            _, idx, gen, _, offset, _ = struct.unpack("<4sIIIQQ", unit)
            owner = NAMES[idx] if idx < len(NAMES) else f"#{idx}"
            if (owner, gen) != (name, state[name]):
                problems.append(f"end: {name} holds at byte {at} a unit written to {owner} "
                                f"gen {gen} at its offset {offset}: another file's bytes")
                break
    return problems


# ---- driver -------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--ops", type=int, default=200, help="operations per worker")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--moneta", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "target", "release",
        "moneta"))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--plain", action="store_true",
                    help="no worker through the shim (validates the checker)")
    # Worker mode (internal).
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--shim", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    ap.add_argument("--lockfile", help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        Worker(a).run()
        return 0
    seed = a.seed if a.seed is not None else int(time.time() * 1000) % (1 << 31)
    print(f"torture: seed {seed} ({a.workers} workers x {a.ops} ops on {a.mount}); "
          f"rerun with --seed {seed}", flush=True)
    work = tempfile.mkdtemp(prefix="moneta-torture-")
    log = os.path.join(work, "log.jsonl")
    state = os.path.join(work, "state.json")
    with open(state, "w") as f:
        json.dump({n: 0 for n in NAMES}, f)
    for n in NAMES:
        try:
            os.unlink(os.path.join(a.mount, n))
        except FileNotFoundError:
            pass
    procs = []
    for i in range(a.workers):
        shim = i % 2 == 0 and not a.plain
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--mount", a.mount,
               "--index", str(i), "--shim", str(int(shim)), "--seed", str(seed),
               "--ops", str(a.ops), "--log", log, "--lockfile", os.path.join(work, "lock"),
               "--state", state]
        if shim:
            cmd = [a.moneta, "run", "--mount", a.mount, "--"] + cmd
        procs.append(subprocess.Popen(cmd))
    deadline = time.monotonic() + a.timeout
    failed = []
    for i, p in enumerate(procs):
        try:
            rc = p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print(f"torture: seed {seed}: workers still running after {a.timeout} s",
                  flush=True)
            return 1
        if rc != 0:
            failed.append(f"worker {i} exited with {rc}")
    problems = failed + check(log, a.mount)
    ops = sum(1 for _ in open(log))
    if problems:
        print(f"torture: seed {seed}: {len(problems)} violation(s) in {ops} logged operations "
              f"(log kept at {log}):")
        for p in problems[:20]:
            print("  " + p)
        return 1
    print(f"torture: seed {seed}: {ops} operations, every read and every file as the model "
          f"says, no unit in the wrong file")
    subprocess.run(["rm", "-rf", work])
    return 0


if __name__ == "__main__":
    sys.exit(main())
