# Amaranth: the two commands are `make run` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
IMAGE ?= $(HOME)/.local/share/amaranth/default.img
MOUNTPOINT ?= /mnt/amaranth
SIZE ?= 8G
BENCH_ARGS ?=

.PHONY: run test deps build lint unit fuse-tests bench bench-quick engine-bench soak crash-soak clean

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

engine-bench:
	scripts/install-deps.sh --engine-bench
	cd bench/engine-bench && $(CARGO) run --release -- $(BENCH_ARGS)

## Long model-based soak of the engine (SOAK_SECONDS, default 600).
soak:
	AMARANTH_SOAK_SECONDS=$${SOAK_SECONDS:-600} $(CARGO) test --release -p amaranth-engine --test soak -- --ignored --nocapture

## Power cuts through the file system for CRASH_SOAK_SECONDS (default 600); prints the states checked.
crash-soak:
	AMARANTH_CRASH_SOAK_SECONDS=$${CRASH_SOAK_SECONDS:-600} $(CARGO) test --release -p amaranth-fs --test crash_soak -- --ignored --nocapture
	AMARANTH_SOAK_SECONDS=$${ENGINE_SOAK_SECONDS:-60} $(CARGO) test --release -p amaranth-engine --test soak -- --ignored --nocapture

clean:
	$(CARGO) clean
