# Amaranth: the two commands are `make run` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
IMAGE ?= $(HOME)/.local/share/amaranth/default.img
MOUNTPOINT ?= /mnt/amaranth
SIZE ?= 8G
BENCH_ARGS ?=

.PHONY: run test deps build lint unit fuse-tests bench bench-quick aging engine-bench soak crash-soak crash-mount imap-crash fuzz-surgery fuzz-fs clean

deps:
	scripts/install-deps.sh

build: deps
	$(CARGO) build --release --workspace

## make run: install what is missing, build, make a default image if there is none, mount it.
run: build
	scripts/run.sh "$(IMAGE)" "$(MOUNTPOINT)" "$(SIZE)"

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --release --workspace

## make test: everything CI runs (what .ci/run calls).
test: deps lint unit
	scripts/test-all.sh

bench:
	scripts/install-deps.sh --bench
	$(CARGO) build --release --workspace
	python3 -m bench $(BENCH_ARGS)

bench-quick:
	scripts/install-deps.sh --bench
	$(CARGO) build --release --workspace
	python3 -m bench --quick $(BENCH_ARGS)

## make aging: the FAST'17 aging experiments (git pulls, mail server, intrafile, interfile) on all four file
## systems at full size, one repetition (AGING_REPEAT; many hours; docs/AGING.md). AGING_ARGS e.g. "--quick",
## "--fs ext4,amaranth", "--set aging_mail_cycles=20", "--set aging_git_gc=1", "--hdd-throttle 150",
## "--resume bench/results/DIR" (continues an interrupted run with its own options, each aging run after its
## last completed point, on a copy of its aged image).
AGING_ARGS ?=
AGING_REPEAT ?= 1
aging:
	scripts/install-deps.sh --bench
	$(CARGO) build --release -p amaranth-cli
	python3 -m bench --bench aging --repeat $(AGING_REPEAT) $(AGING_ARGS)

engine-bench:
	scripts/install-deps.sh --engine-bench
	cd bench/engine-bench && $(CARGO) run --release -- $(BENCH_ARGS)

## Long model-based soak of the engine (SOAK_SECONDS, default 600).
soak:
	AMARANTH_SOAK_SECONDS=$${SOAK_SECONDS:-600} $(CARGO) test --release -p amaranth-engine --test soak -- --ignored --nocapture

## Range moves and slices against the model with 8 KiB nodes for SECONDS (default 600), from SEED
## (default 0x5eed); prints every seed (replay: AMARANTH_SEED=… AMARANTH_SURGERY=1
## AMARANTH_NODE_SIZE=8192 cargo test --release -p amaranth-engine --test model replay).
fuzz-surgery:
	AMARANTH_FUZZ_SECONDS=$(or $(SECONDS),600) AMARANTH_SEED_BASE=$(or $(SEED),24301) $(CARGO) test --release -p amaranth-engine --test model surgery_fuzz -- --ignored --nocapture

## The file system against its model for RUNS seeds (default 2000) of 600 steps from SEED (default
## 7340032); prints every seed (replay: AMARANTH_SEED=… cargo test --release -p amaranth-fs --test model replay).
fuzz-fs:
	AMARANTH_FS_MODEL_RUNS=$(or $(RUNS),2000) AMARANTH_SEED_BASE=$(or $(SEED),7340032) $(CARGO) test --release -p amaranth-fs --test model random_file_system_sequences_match_the_model -- --nocapture

## Power cuts through the file system for CRASH_SOAK_SECONDS (default 600); prints the states checked.
crash-soak:
	AMARANTH_CRASH_SOAK_SECONDS=$${CRASH_SOAK_SECONDS:-600} $(CARGO) test --release -p amaranth-fs --test crash_soak -- --ignored --nocapture
	AMARANTH_SOAK_SECONDS=$${ENGINE_SOAK_SECONDS:-60} $(CARGO) test --release -p amaranth-engine --test soak -- --ignored --nocapture

## kill -9 of the daemon during untar/rsync/integrity/SQLite workloads on a real mount, CRASH_CYCLES
## times (default 100; needs root and /dev/fuse); prints each cycle, the cycles done and failures.
crash-mount: deps
	set -o pipefail; AMARANTH_CRASH_CYCLES=$${CRASH_CYCLES:-100} $(CARGO) test --release -p amaranth-cli --test crash_mount -- --nocapture 2>&1 | grep --line-buffered -E '^(== |kept |test result|failed cycles|cycle [0-9]+ )'

## Dovecot moving mail without fsync, the Amaranth daemon killed at random points IMAP_CRASH_CYCLES
## times (default 50; root): every message in one of the two folders, Dovecot's index agrees.
imap-crash:
	scripts/install-deps.sh --bench
	$(CARGO) build --release --workspace
	python3 -m bench --bench imapcrash --fs amaranth --no-fio --set imap_crash_cycles=$${IMAP_CRASH_CYCLES:-50} $(BENCH_ARGS)

clean:
	$(CARGO) clean
