# dvmlab: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
SKIPS := $(CURDIR)/target/dvmlab-skipped.txt

.PHONY: fuzz fuzz-smoke demo test lint soak soak-ci soak-broken bench bench-compare bench-pair bench-anatomy bench-peers bench-scale bench-readme build gc clean conformance conformance-matrix conformance-adapter conformance-probe conformance-docker-tree conformance-openpmix traceability lab lab-bins lab-image lab-swarm lab-down lab-test

## Build, stand up an 8-node DVM (netns hosts as root, loopback processes otherwise), show it, stop it.
demo: build
	./target/debug/dvmlab-harness up --nodes 8 --radix 2

build:
	cargo build --workspace --bins

## Lint, then every test of the workspace (the conformance suite included, and once more
## through each worked-example adapter); tests that had to skip are listed loudly at the end.
test: lint
	@rm -f $(SKIPS)
	@# What earlier runs left is cleared first, so gc --strict at the end counts what this run left (and anything gc could not remove).
	cargo run -q -p dvmlab-harness --bin dvmlab-harness -- gc
	@# A CI log may be cut to its end: the steps that failed, and nextest's failing tests, are
	@# named again there.
	set -o pipefail; export DVMLAB_SKIP_LOG=$(SKIPS) DVMLAB_SKIP_PROFILE_BUILD=1; failed=; \
	cargo nextest run --workspace --no-fail-fast 2>&1 | tee $(CURDIR)/target/nextest-output.txt || failed="$$failed nextest"; \
	for step in conformance-adapter conformance-probe conformance-docker-tree conformance-openpmix soak-ci; do \
	  $(MAKE) --no-print-directory $$step || failed="$$failed $$step"; \
	done; \
	./target/debug/dvmlab-harness gc --strict || failed="$$failed gc-strict"; \
	if [ -s $(SKIPS) ]; then \
	  echo; echo "!!!!!!!! SOME TESTS SKIPPED (they need root / network namespaces) !!!!!!!!"; \
	  cat $(SKIPS); echo; \
	fi; \
	if [ -n "$$failed" ]; then \
	  echo; echo "!!!!!!!! FAILED:$$failed !!!!!!!!"; \
	  case " $$failed " in *" nextest "*) sed -n '/^ *Summary \[/,$$p' $(CURDIR)/target/nextest-output.txt;; esac; \
	  exit 1; \
	fi

## The conformance suite alone: every spec item on the reference runtime (default cell).
conformance:
	cargo test -p conformance

## The conformance suite in every cell of IPv4/IPv6 x radix {2, 3, 64}.
conformance-matrix:
	DVMLAB_IP=4,6 DVMLAB_RADIX=2,3,64 DVMLAB_RESULTS=$(CURDIR)/target/conformance-matrix cargo test -p conformance --test conformance

## The conformance suite through the worked-example adapter (human-readable status).
conformance-adapter:
	DVMLAB_PROFILE=$(CURDIR)/conformance/profiles/human-status-example.toml DVMLAB_RESULTS=$(CURDIR)/target/conformance-adapter cargo test -p conformance --test conformance

## The bootstrap catalog through the worked example of a runtime with no status command
## (a probe job per status read; the tree read from the network).
conformance-probe:
	DVMLAB_PROFILE=$(CURDIR)/conformance/profiles/probe-job-example.toml DVMLAB_RESULTS=$(CURDIR)/target/conformance-probe cargo test -p conformance --test conformance -- bootstrap

## The tree items on Docker hosts through the probe-job profile: the tree, healing and the
## controller's place read from the containers' connections alone.
conformance-docker-tree:
	DVMLAB_BACKEND=docker DVMLAB_PROFILE=$(CURDIR)/conformance/profiles/probe-job-example.toml DVMLAB_RESULTS=$(CURDIR)/target/conformance-docker-tree cargo test -p conformance --test conformance -- bootstrap.radix bootstrap.C3 bootstrap.wireup.heal

## The events (RFC 0002) items on real OpenPMIx (Debian's libpmix): a one-node PMIx host
## server with real clients and tools. Passes when exactly the deviations listed in
## conformance/profiles/openpmix.expected.toml fail. Builds its adapter (C) itself.
conformance-openpmix:
	@if ! pkg-config --exists pmix json-c; then \
	  echo "!!!!!!!! SKIPPED conformance-openpmix: needs libpmix-dev and libjson-c-dev (.ci/run installs them) !!!!!!!!"; \
	  if [ -n "$$DVMLAB_SKIP_LOG" ]; then echo "conformance-openpmix: needs libpmix-dev and libjson-c-dev" >> "$$DVMLAB_SKIP_LOG"; fi; \
	  exit 0; \
	fi; \
	env -u DVMLAB_SKIP_PROFILE_BUILD DVMLAB_PROFILE=$(CURDIR)/conformance/profiles/openpmix.toml DVMLAB_RESULTS=$(CURDIR)/target/conformance-openpmix cargo test -p conformance --test conformance -- rfc0002

## Rerun the whole suite and rewrite conformance/TRACEABILITY.md with its results.
traceability:
	DVMLAB_WRITE_TRACEABILITY=1 cargo test -p conformance --test conformance

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

## Benchmarks that compare (README, "Performance"): every figure beside the machine's own
## floor for the same work, measured in the same run, and the ratio. `make bench` drives a
## runtime only through its conformance profile (PROFILE, default dvmlab's) on netns hosts
## (root), then runs the reference runtime's own benches: the DVM key's cost, the elastic
## requests, events (beside OpenPMIx when libpmix-dev is installed).
PROFILE ?= conformance/profiles/reference.toml
PROFILES ?= conformance/profiles/reference.toml conformance/profiles/human-status-example.toml
BENCH_SIZES ?= 8,32,128
BENCH_REPS ?= 3
SCALE_SIZES ?= 1024,2048
BENCH := cargo run --release -q -p dvmlab-bench --
## The runtime the benches measure is built with profile-guided optimization (PGO=0: the
## plain release build): bench/pgo-train runs an instrumented build through a training
## workload once per change of the runtime's sources, and the benches' build (its own target
## directory, target/pgo/use) is optimized with what it recorded. Only for dvmlab's own
## profiles: a target measuring any other profile builds plainly, its build command left as
## its author wrote it. Without llvm-profdata (.ci/run installs Debian's llvm-19) the benches
## measure the plain release build and say so; the tables' stamps name the build.
PGO ?= 1
PGO_DIR := $(CURDIR)/target/pgo
OWN_PROFILES := conformance/profiles/reference.toml conformance/profiles/human-status-example.toml
# The shell prefix of a bench target measuring the profiles $(1).
with_pgo = if [ "$(if $(filter-out $(OWN_PROFILES),$(1)),0,$(PGO))" = 1 ] && bench/pgo-train "$(PGO_DIR)"; then \
	  export CARGO_TARGET_DIR="$(PGO_DIR)/use" RUSTFLAGS="$$RUSTFLAGS -Cprofile-use=$(PGO_DIR)/dvmlab.profdata" \
	    DVMLAB_BENCH_BUILD="release, profile-guided (bench/pgo-train)"; \
	  echo "bench: the runtime built with profile-guided optimization ($(PGO_DIR))"; \
	else export DVMLAB_BENCH_BUILD="release"; \
	  echo "bench: the plain release build (PGO=0, a profile not dvmlab's, or no profile trained)"; fi;
bench:
	@$(call with_pgo,$(PROFILE)) $(BENCH) run --profile $(PROFILE) --sizes $(BENCH_SIZES) --reps $(BENCH_REPS)
	cargo bench -p dvmlab-runtime --bench key
	DVMLAB_BACKEND=netns cargo bench -p dvmlab-runtime --bench elastic
	@if pkg-config --exists pmix json-c; then \
	  mkdir -p target/bench && $(MAKE) -s -C conformance/examples/openpmix OUT=$(CURDIR)/target/bench/pmix-adapter && \
	  DVMLAB_PMIX_ADAPTER=$(CURDIR)/target/bench/pmix-adapter cargo bench -p dvmlab-runtime --bench events; \
	else \
	  echo "events bench without OpenPMIx beside it: needs libpmix-dev and libjson-c-dev"; \
	  cargo bench -p dvmlab-runtime --bench events; \
	fi

## PROFILES measured alternately in one run: medians, spread, ratios side by side.
bench-compare:
	@$(call with_pgo,$(PROFILES)) $(BENCH) run $(foreach p,$(PROFILES),--profile $(p)) --sizes $(BENCH_SIZES) --reps $(BENCH_REPS)

## Two PROFILES' jobs in pairs: both DVMs held side by side, jobs alternated, each difference
## taken within its pair (resolves a few per cent; PAIRS pairs at PAIR_SIZES nodes).
PAIR_SIZES ?= 32,128
PAIRS ?= 40
bench-pair:
	@$(call with_pgo,$(PROFILES)) $(BENCH) pair $(foreach p,$(PROFILES),--profile $(p)) --sizes $(PAIR_SIZES) --pairs $(PAIRS)

## Where a job's time goes: jobs on a held DVM, each beside a run of its floor, the CPU of both
## split by who ran it (daemons by their place in the tree, the tool, the programs).
ANATOMY_SIZES ?= 32,128
ANATOMY_JOBS ?= 20
bench-anatomy:
	@$(call with_pgo,$(PROFILE)) $(BENCH) anatomy --profile $(PROFILE) --sizes $(ANATOMY_SIZES) --jobs $(ANATOMY_JOBS)

## dvmlab against Open MPI's mpirun (Debian's openmpi-bin), one-shot work on the same hosts.
bench-peers:
	@$(call with_pgo,$(PROFILE)) $(BENCH) peers --profile $(PROFILE) --sizes $(BENCH_SIZES) --reps $(BENCH_REPS)

## Formation and a job per node at SCALE_SIZES netns hosts, with memory.
bench-scale:
	@$(call with_pgo,$(PROFILE)) $(BENCH) run --profile $(PROFILE) --sizes $(SCALE_SIZES) --reps 1 --sequential 0 --grow 0 --job-reps 3 --name scale

## The README's performance section, rebuilt from what the runs above wrote.
bench-readme:
	$(BENCH) readme

## Every fuzz target (cargo-fuzz, nightly) for FUZZ_SECONDS each, from the checked-in corpus;
## new inputs go to target/fuzz-corpus, a crash to runtime/fuzz/artifacts (keep it as a
## regression: runtime/fuzz/regressions/TARGET/).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := frame_decoder handshake conf idset
fuzz:
	cd runtime/fuzz && for t in $(FUZZ_TARGETS); do \
	  echo "fuzz target $$t ($(FUZZ_SECONDS) s):" && mkdir -p ../../target/fuzz-corpus/$$t && \
	  cargo +nightly fuzz run -O --target-dir ../../target/fuzz $$t ../../target/fuzz-corpus/$$t corpus/$$t -- \
	    -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 2>&1 | \
	    grep -E 'stat::number_of_executed_units|Done|ERROR|panicked|SUMMARY|crash-|Test unit written'; \
	  test $${PIPESTATUS[0]} -eq 0 || exit 1; \
	done

## What CI runs: each fuzz target for 15 seconds.
fuzz-smoke:
	$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=15

## The soak (README, "Soak"): an elastic DVM of NODES netns hosts and SPARES spare hosts
## under a seeded workload and nemesis for DURATION seconds, its history checked by an
## independent checker. Report, charts, history and every host's log in SOAK_OUT.
NODES ?= 64
SPARES ?= 8
DURATION ?= 1800
SEED ?= 1
BACKEND ?= netns
SOAK_OUT ?= $(CURDIR)/target/soak/seed-$(SEED)
SOAK_PROFILE ?= release
soak:
	cargo build --profile $(SOAK_PROFILE) -q --bins -p dvmlab-runtime -p dvmlab-harness -p dvmlab-soak
	./target/$(if $(filter dev,$(SOAK_PROFILE)),debug,$(SOAK_PROFILE))/dvmlab-soak run --nodes $(NODES) --spares $(SPARES) --duration $(DURATION) --seed $(SEED) --backend $(BACKEND) --out $(SOAK_OUT)

## The short soak CI runs: 16 nodes, 2 minutes, a fixed seed (needs root for netns hosts),
## on the debug build the tests already made.
soak-ci:
	@if [ "$$(id -u)" != 0 ]; then \
	  echo "!!!!!!!! SKIPPED soak-ci: the soak's hosts are network namespaces, which need root !!!!!!!!"; \
	  if [ -n "$$DVMLAB_SKIP_LOG" ]; then echo "soak-ci: needs root" >> "$$DVMLAB_SKIP_LOG"; fi; \
	  if [ -n "$$CI" ]; then exit 1; fi; exit 0; \
	fi; \
	$(MAKE) --no-print-directory soak NODES=16 SPARES=4 DURATION=120 SEED=7 SOAK_PROFILE=dev SOAK_OUT=$(CURDIR)/target/soak/ci

## The checker shown failing on real runs: a short soak of a runtime broken on purpose, once
## per defect (dvmlab_test_elastic_fault), each passing only if the checker flags the property
## that defect breaks, and the same soak of the runtime as it is, which must pass. Reports in
## target/soak/broken/RUN; SOAK_KEEP=1 keeps the histories as soak/tests/histories/RUN.jsonl
## (what checker_flags_runs_of_broken_runtimes reads).
SOAK_BROKEN = launch-on-departing:starts-on-wired-daemons lose-held-jobs:jobs-end-once duplicate-terminal:one-terminal-event
SOAK_SHORT = --nodes 16 --spares 4 --duration 120 --seed 7
soak-broken:
	cargo build -q --bins -p dvmlab-runtime -p dvmlab-harness -p dvmlab-soak
	@status=0; keep() { if [ -n "$(SOAK_KEEP)" ]; then cp target/soak/broken/$$1/history.jsonl soak/tests/histories/$$1.jsonl; fi; }; \
	echo "== soak of the runtime as it is: every property must hold"; \
	if ./target/debug/dvmlab-soak run $(SOAK_SHORT) --out $(CURDIR)/target/soak/broken/unbroken; then keep unbroken; else status=1; fi; \
	for d in $(SOAK_BROKEN); do \
	  echo "== soak of a runtime broken with $${d%%:*}: $${d##*:} must be violated"; \
	  if ./target/debug/dvmlab-soak run $(SOAK_SHORT) --runtime-fault $${d%%:*} --expect-violation $${d##*:} --out $(CURDIR)/target/soak/broken/$${d%%:*}; \
	  then keep $${d%%:*}; else status=1; fi; \
	done; exit $$status

## Remove namespaces, run directories and locks left by crashed runs.
gc: build
	./target/debug/dvmlab-harness gc

clean:
	cargo clean

## The lab: NODES nodes (default 32) in Docker containers (the harness's docker backend),
## radix RADIX, IP version IP, and SPARES spare hosts the elastic DVM can grow onto.
NODES ?= 32
SPARES ?= 4
RADIX ?= 64
IP ?= 4
STATIC := target/static/x86_64-unknown-linux-gnu/release
LAB := ./target/release/lab

lab:
	cargo build --release -q -p dvmlab-runtime -p dvmlab-lab --bins
	$(LAB) up --backend docker --nodes $(NODES) --radix $(RADIX) --ip $(IP) --spares $(SPARES)

## The conformance suite with every host a Docker container (the harness's docker backend).
lab-test:
	DVMLAB_BACKEND=docker DVMLAB_RESULTS=$(CURDIR)/target/conformance-docker cargo test -p conformance --test conformance

## Remove every container, network and rule the lab made (and nothing else).
lab-down:
	cargo build --release -q -p dvmlab-lab
	$(LAB) down

## Statically linked runtime binaries for the FROM-scratch image (glibc, crt-static).
lab-bins:
	RUSTFLAGS="-C target-feature=+crt-static -C strip=debuginfo" cargo build --release -q -p dvmlab-runtime \
	  --bins --target x86_64-unknown-linux-gnu --target-dir target/static

## The lab as a stack on Docker's swarm mode, from the FROM-scratch image: on a one-node
## swarm made here on loopback if the engine is in none (`docker swarm leave --force` undoes
## it). `make lab-down` removes the stack.
lab-swarm: lab-image
	@state=$$(docker info --format '{{.Swarm.LocalNodeState}}'); \
	if [ "$$state" = inactive ]; then \
	  echo "making this engine a one-node swarm (docker swarm leave --force undoes it)"; \
	  docker swarm init --advertise-addr 127.0.0.1 >/dev/null; \
	fi
	$(LAB) up --swarm --nodes $(NODES) --radix $(RADIX) --spares $(SPARES)

## The FROM-scratch image `lab export` runs (compose, Kubernetes).
lab-image: lab-bins
	cargo build --release -q -p dvmlab-lab
	@test -x /bin/busybox || { echo "the lab image needs a static busybox: apt-get install busybox-static"; exit 1; }
	$(LAB) image --bin-dir $(STATIC) --busybox /bin/busybox
