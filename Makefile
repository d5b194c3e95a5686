# Moneta in software. `make run` and `make test` work on a fresh machine.
CARGO ?= cargo
MONETA := target/release/moneta
MDBOOK_VERSION := 0.5.4

.PHONY: all setup build run test docs bench fidelity calibrate torture san san-chaos san-sim nvmm clean

all: build

# Toolchain pieces and system packages the tests use (xfsprogs for moneta up;
# fio, sqlite3, Berkeley DB and PostgreSQL for the workloads on its file
# system; xfs_fsr, e4defrag, losetup and blkdiscard for the torture gate; python3
# for the program benchmarks; libnbd-bin, nbdkit and qemu-utils
# for the NBD conformance tests; iproute2 for the wire's veth tests; g++ for
# the C++ header check, strace, fuser and pgrep for the CLI's tests; qemu-system-x86
# and busybox-static for moneta vm); idempotent.
# A test that needs a tool missing here fails (crates/moneta-testkit).
setup:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup)"; exit 1; }
	@rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
	@rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
	@command -v mkfs.xfs >/dev/null && command -v xfs_fsr >/dev/null || (apt-get update && apt-get install -y xfsprogs)
	@command -v e4defrag >/dev/null || (apt-get update && apt-get install -y e2fsprogs)
	@command -v blkdiscard >/dev/null && command -v losetup >/dev/null || (apt-get update && apt-get install -y util-linux)
	@command -v clang >/dev/null || (apt-get update && apt-get install -y clang)
	@command -v fio >/dev/null || (apt-get update && apt-get install -y fio)
	@command -v sqlite3 >/dev/null || (apt-get update && apt-get install -y sqlite3)
	@dpkg -s libdb5.3-dev >/dev/null 2>&1 || (apt-get update && apt-get install -y libdb5.3-dev)
	@command -v db5.3_stat >/dev/null || (apt-get update && apt-get install -y db5.3-util)
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && command -v pg_amcheck >/dev/null \
		|| (apt-get update && apt-get install -y postgresql postgresql-contrib)
	@command -v python3 >/dev/null || (apt-get update && apt-get install -y python3)
	@command -v nbdcopy >/dev/null && command -v nbdfuse >/dev/null || (apt-get update && apt-get install -y libnbd-bin)
	@command -v nbdkit >/dev/null || (apt-get update && apt-get install -y nbdkit)
	@command -v qemu-img >/dev/null || (apt-get update && apt-get install -y qemu-utils)
	@command -v ip >/dev/null || (apt-get update && apt-get install -y iproute2)
	@command -v gcc >/dev/null && command -v dpkg-source >/dev/null || (apt-get update && apt-get install -y gcc dpkg-dev)
	@command -v g++ >/dev/null || (apt-get update && apt-get install -y g++)
	@command -v strace >/dev/null || (apt-get update && apt-get install -y strace)
	@command -v fuser >/dev/null || (apt-get update && apt-get install -y psmisc)
	@command -v pgrep >/dev/null || (apt-get update && apt-get install -y procps)
	@# moneta vm: QEMU and a static busybox for the guest's initramfs (the kernel is
	@# fetched by `moneta vm run` itself, apt-get download, into /var/cache/moneta/vm).
	@command -v qemu-system-x86_64 >/dev/null || (apt-get update && apt-get install -y --no-install-recommends qemu-system-x86)
	@dpkg -s busybox-static >/dev/null 2>&1 || (apt-get update && apt-get install -y busybox-static)
	@# The figures' text in PNG and PDF (--plot x.png, x.pdf): a sans-serif font.
	@dpkg -s fonts-dejavu-core >/dev/null 2>&1 || (apt-get update && apt-get install -y fonts-dejavu-core)
	@# The fio engine is built against the installed fio's Debian source: deb-src of the mirror in use.
	@apt-cache showsrc fio 2>/dev/null | grep -q '^Package: fio' || { \
		if [ -f /etc/apt/sources.list.d/debian.sources ]; then \
			sed 's/^Types: deb$$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
				> /etc/apt/sources.list.d/moneta-deb-src.sources; \
		else \
			sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > /etc/apt/sources.list.d/moneta-deb-src.list; \
		fi; apt-get update; }
	@mdbook --version 2>/dev/null | grep -q 'v$(MDBOOK_VERSION)$$' || $(CARGO) install mdbook --locked --version $(MDBOOK_VERSION)

build:
	$(CARGO) build --release
	$(MAKE) -C fio-engine

# The main job: a simulated bandwidth-vs-request-size sweep of the default
# preset, as a table, plus an SVG plot and an HTML report under out/; then
# short real-time benchmarks on the embedded emulator (real bytes, wall
# clock), the first beside its simulation, each ending on its verdict.
# Both are one request in flight: what two cores can keep at the model's
# time (a null device at QD32 is a throughput test, never faithful here).
run: build
	@mkdir -p out
	$(MONETA) sim sweep --preset moneta --op read,write,mixed --plot out/sweep.svg --report out/sweep.html
	@echo "Emulator: each run ends on a verdict. 'faithful': its completions reached the program, on average,"
	@echo "within 10% of the modeled latency (at least 2 us) of the model's time; 'not faithful': this host fell behind,"
	@echo "so those numbers are the host's, not the device's (a busy machine: rerun when it is quiet)."
	$(MONETA) bench --preset onyx-late --op read --size 4096 --duration-ms 1000 --compare-sim
	$(MONETA) bench --preset moneta --op write --size 65536 --duration-ms 1000

# Set-up plus every test: format, lints, unit/property/integration tests,
# the calibration suite, and the benchmark in smoke mode. The model and
# device tests run a second time in the `checked` profile (Cargo.toml):
# debug assertions and overflow checks on, so every invariant check runs. The workspace is
# built before the tests run: moneta-preload's tests/engine_free.rs checks
# the libmoneta_preload.so that this whole-workspace build made.
test: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings
	$(CARGO) build --release
	$(MAKE) -C fio-engine
	$(CARGO) test --workspace --release
	$(CARGO) test --profile checked -p moneta-model
	$(CARGO) test --profile checked -p moneta-emu --lib --test daemon --test starvation --test san_sim
	$(MONETA) docs --check --out docs/src
	$(MAKE) --no-print-directory docs
	$(MONETA) sim speed --preset moneta --ops 200000
	$(MONETA) san sim latency --ops 200
	$(MONETA) san sim bandwidth --ops 500 --sizes 512,262144 --op read,write
	$(MONETA) san sim scaling --ops 500 --nodes 2,4
	$(MONETA) san sim replication --ops 500 --op read,write
	$(MONETA) san sim sort --scale 0.0005 --measure-records 200000
	$(MONETA) san sim energy --ops 500
	$(MONETA) san sim-protocol --seed 1 --runs 4 --ops 3000
	$(CARGO) bench --workspace --bench overhead -- --smoke
	$(CARGO) bench --workspace --bench fidelity -- --smoke
	$(CARGO) bench --workspace --bench nbd -- --smoke
	$(CARGO) bench --workspace --bench san_speed -- --smoke
	$(CARGO) bench --workspace --bench wire -- --smoke
	$(MONETA) nvmm sim sweep --latencies 25000,75000 --threads 1,8
	$(MONETA) nvmm sim wear --endurance-scale 1000
	$(CARGO) bench --workspace --bench nvmm_speed -- --smoke
	$(CARGO) bench --workspace --bench nvmm -- --smoke
	$(CARGO) bench --workspace --bench model_vs_library -- --smoke

# The documentation site (docs/src, mdBook): the reference pages from the
# code, the calibration results page with its provenance, the book in
# target/book/, and a check that every link and SPEC section resolves and
# that README stays a user's README.
docs: build
	$(MONETA) docs --out docs/src --results
	mdbook build docs
	python3 scripts/check_docs.py

# Simulator speed: simulated 4 KB requests per wall-clock second (target ≥ 2M);
# emulator software overhead against pread(2) on tmpfs and against the raw
# cross-core round trip, and QD32 throughput (out/overhead.json).
bench: build
	@mkdir -p out
	$(MONETA) sim speed --preset moneta --ops 4000000
	$(MONETA) sim speed --preset moneta --ops 4000000 --op write
	$(CARGO) bench --workspace --bench san_speed
	$(CARGO) bench --workspace --bench nvmm_speed
	$(MONETA) sim speed --preset onyx-late --ops 400000 --op write
	$(CARGO) bench --workspace --bench overhead -- --json $(CURDIR)/out/overhead.json
	$(CARGO) bench --workspace --bench nbd -- --json $(CURDIR)/out/nbd.json

# The emulator's timing against the simulator's on this machine, now: the
# fidelity floor (smallest modeled QD1 latency reproduced within 5%) and
# the published configurations (out/fidelity.json). A benchmark: it prints
# its figures against their goals and does not fail on a loaded machine.
fidelity: build
	@mkdir -p out
	$(CARGO) bench --workspace --bench fidelity -- --json $(CURDIR)/out/fidelity.json

# The direct path's differential torture harness, long mode (issue 20,
# README "The gate: moneta-torture"): the scripted data-loss classes, then
# seeded random schedules (each run through the kernel alone and through
# the shim, compared) until TORTURE_OPS operations ran on each file system.
# TORTURE_SEED starts the seeds (default: from the clock).
TORTURE_OPS ?= 10000000
TORTURE_WORKERS ?= 4
TORTURE_RUN_OPS ?= 20000
TORTURE_FS ?= xfs ext4
torture: build
	@for fs in $(TORTURE_FS); do \
		m=/tmp/moneta-torture-$$fs; \
		$(MONETA) up --mount $$m --size 2G --fs $$fs --fresh >/dev/null || exit 1; \
		target/release/moneta-torture scenario all --mount $$m --moneta $(MONETA) || \
			{ $(MONETA) down --purge --mount $$m; exit 1; }; \
		seed=$${TORTURE_SEED:-$$(date +%s)}; done_ops=0; \
		while [ $$done_ops -lt $(TORTURE_OPS) ]; do \
			target/release/moneta-torture run --mount $$m --moneta $(MONETA) --seed $$seed \
				--workers $(TORTURE_WORKERS) --ops $(TORTURE_RUN_OPS) --json || \
				{ $(MONETA) down --purge --mount $$m; exit 1; }; \
			done_ops=$$((done_ops + $(TORTURE_WORKERS) * $(TORTURE_RUN_OPS))); seed=$$((seed + 1)); \
			echo "torture $$fs: $$done_ops of $(TORTURE_OPS) operations, no differences"; \
		done; \
		$(MONETA) down --purge --mount $$m; \
	done

# The calibration table of README.
calibrate: build
	$(MONETA) calibrate

# The QuickSAN predictions of README ("QuickSAN"): every §5.4 experiment
# at its defaults, as JSON under out/san/ with SVG plots (several minutes).
san: build
	@mkdir -p out/san
	$(MONETA) san sim latency --format json --plot out/san/latency.svg > out/san/latency.json
	$(MONETA) san sim bandwidth --topology distributed --format json --plot out/san/bw_dist.svg > out/san/bw_dist.json
	$(MONETA) san sim bandwidth --topology centralized --format json --plot out/san/bw_central.svg > out/san/bw_central.json
	$(MONETA) san sim scaling --nodes 1,2,4,8,16 --format json --plot out/san/scaling.svg > out/san/scaling.json
	$(MONETA) san sim replication --format json --plot out/san/replication.svg > out/san/replication.json
	$(MONETA) san sim energy --format json --plot out/san/energy.svg > out/san/energy.json
	$(MONETA) san sim sort --scale 0.01 --format json --plot out/san/sort.svg > out/san/sort.json

# NVMM (SPEC §7, issue 13): the report's backing-store latency sweep (GUPS
# and MMAP; NVMM with and without prefetch, 1 and 8 threads, against DRAM +
# SSD and all-DRAM), its plot, and the wear estimate with its plot.
nvmm: build
	@mkdir -p out
	$(MONETA) nvmm sim sweep --plot out/nvmm_sweep.svg
	$(MONETA) nvmm sim wear --plot out/nvmm_wear.svg

clean:
	$(CARGO) clean
	rm -rf out

# The deterministic simulator of the replica protocol (moneta san sim-protocol:
# the daemons' replica logic on one thread, virtual clock, in-memory wire,
# seeded nemesis with operator resolves and forces, register checker):
# 20,000-operation schedules from SAN_SIM_SEED (default: from the clock;
# printed, with the command that replays a failing one, shrunk) until
# SAN_SIM_OPS operations (10 M) or SAN_SIM_MINUTES of wall clock (15),
# whichever comes first, on SAN_SIM_JOBS threads (2).
SAN_SIM_MINUTES ?= 15
SAN_SIM_OPS ?= 10000000
SAN_SIM_JOBS ?= 2
san-sim: build
	$(MONETA) san sim-protocol --minutes $(SAN_SIM_MINUTES) --max-ops $(SAN_SIM_OPS) \
		--jobs $(SAN_SIM_JOBS) --ops 20000 --shrink 40 --keep-going --split-brains \
		$(if $(SAN_SIM_SEED),--seed $(SAN_SIM_SEED))

# The SAN's randomized fault schedule with the register checker (issue 22
# item 6; root): a mirrored SAN of its own, kill -9, restart, partitions,
# lossy links and resolve, every read checked. Long by default (30 min);
# SAN_CHAOS_SECONDS, SAN_CHAOS_SEED (default: the clock; printed),
# SAN_CHAOS_NODES (3-5) and SAN_CHAOS_CLIENTS_ON (majority: no client uses a
# node while it is cut off; any: also the cut-off side, where the SAN without
# quorum serves its own copies) change it. The summary goes to out/san-chaos.json.
SAN_CHAOS_SECONDS ?= 1800
SAN_CHAOS_NODES ?= 3
SAN_CHAOS_CLIENTS_ON ?= majority
san-chaos: build
	@mkdir -p out
	$(MONETA) san chaos --name chaosmk --nodes $(SAN_CHAOS_NODES) --duration-s $(SAN_CHAOS_SECONDS) \
		--clients-on $(SAN_CHAOS_CLIENTS_ON) $(if $(SAN_CHAOS_SEED),--seed $(SAN_CHAOS_SEED)) --json > out/san-chaos.json
