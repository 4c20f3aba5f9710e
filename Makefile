# epcache: run `make` (or `make help`) for the list of targets.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCHSTAT   ?= golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
# The library is the root module; the harness (bench, cmd/epbench,
# internal/resultsdoc) and the linearizability check (internal/lincheck) are
# modules of their own, joined by go.work, so that a program importing the
# library gets none of their dependencies. The etcd module is built on its
# own (GOWORK=off), as its users build it.
PKGS        := ./... ./bench/... ./cmd/epbench/... ./internal/resultsdoc/... ./internal/lincheck/...
RESULTS     ?= results

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: test
test: fmt-check vet lint race test-norace test-32bit bench-smoke test-etcd test-observe test-grpc ## gofmt, vet, staticcheck, race tests, the tests the race detector skips, 32-bit tests, every benchmark once, the etcd module against an embedded etcd, the metrics modules, the gRPC pool

.PHONY: fmt-check
fmt-check: ## fail if any file is not gofmt'ed
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: vet
vet: ## go vet, for the host and for 32-bit x86 (64-bit atomic alignment)
	$(GO) vet $(PKGS)
	GOARCH=386 $(GO) vet $(PKGS)

.PHONY: lint
lint: ## staticcheck, at a pinned version
	$(GO) run $(STATICCHECK) $(PKGS)

.PHONY: race
race: ## all tests under the race detector
	$(GO) test -race -count=1 $(PKGS)

.PHONY: test-norace
test-norace: ## the tests that race instrumentation defeats, without it: what the hit path and the lease call, inline and allocate
	$(GO) test -count=1 -run 'TestHitPathMakesNoCalls|AllocatesNothing' ./epcache

.PHONY: test-32bit
test-32bit: ## the core packages' tests as a 32-bit program, where a 64-bit atomic must be 8-byte aligned: 386 where the kernel runs it, else 32-bit ARM under qemu-arm (package qemu-user)
	@if [ "$$($(MAKE) -s can-run-386)" = yes ]; then \
		echo "GOARCH=386 $(GO) test -short -count=1 ./shard ./epcache"; \
		GOARCH=386 $(GO) test -short -count=1 ./shard ./epcache; \
	elif command -v qemu-arm >/dev/null; then \
		echo "this kernel runs no 32-bit x86 program: the 32-bit tests run as 32-bit ARM under qemu-arm"; \
		echo "GOARCH=arm GOARM=7 $(GO) test -short -count=1 -exec qemu-arm ./shard ./epcache"; \
		GOARCH=arm GOARM=7 $(GO) test -short -count=1 -exec qemu-arm ./shard ./epcache; \
	else \
		echo "test-32bit: this kernel runs no 32-bit x86 program and qemu-arm is missing: install qemu-user (Debian) to run the 32-bit tests" >&2; \
		exit 1; \
	fi

# can-run-386 prints yes if this machine executes a 32-bit x86 Go program
# (a kernel built without IA32 emulation does not: "exec format error").
.PHONY: can-run-386
can-run-386:
	@d=$$(mktemp -d) && \
	if GOARCH=386 $(GO) test -c -o $$d/probe ./internal/flaglist >/dev/null 2>&1 && $$d/probe -test.run '^$$' >/dev/null 2>&1; then echo yes; else echo no; fi; \
	rm -rf $$d

.PHONY: test-etcd
test-etcd: ## the etcd module (etcd/: the etcd directory, epmesh): vet, staticcheck and race tests against an embedded etcd it starts itself
	cd etcd && GOWORK=off $(GO) vet ./...
	cd etcd && GOWORK=off $(GO) run $(STATICCHECK) ./...
	cd etcd && GOWORK=off $(GO) test -race -count=1 ./...

.PHONY: test-observe
test-observe: ## the metrics modules (observe/prometheus, observe/otel), each on its own as its users build it: vet, staticcheck, race tests
	for m in observe/prometheus observe/otel; do \
		(cd $$m && GOWORK=off $(GO) vet ./... && GOWORK=off $(GO) run $(STATICCHECK) ./... && GOWORK=off $(GO) test -race -count=1 ./...) || exit 1; \
	done

.PHONY: test-grpc
test-grpc: ## the gRPC pool (transport/grpcpool), on its own as its users build it: vet, staticcheck, race tests against real gRPC servers on loopback
	cd transport/grpcpool && GOWORK=off $(GO) vet ./...
	cd transport/grpcpool && GOWORK=off $(GO) run $(STATICCHECK) ./...
	cd transport/grpcpool && GOWORK=off $(GO) test -race -count=1 ./...

.PHONY: results-grpc
results-grpc: ## the gRPC pool against Grafana dskit's ring client pool, eight scenarios on real gRPC servers, into results/grpcpool (about two minutes)
	cd transport/grpcpool/dskitbench && GOWORK=off $(GO) test -race -count=1 ./...
	cd transport/grpcpool/dskitbench && GOWORK=off $(GO) run ./cmd/grpcbench -out $(CURDIR)/$(RESULTS)/grpcpool

.PHONY: results-directory
results-directory: ## what the etcd directory costs etcd as the job grows (dirscale, N up to 1,024, both modes and the fence; about 3 minutes) and epmesh with real processes, into results/directory
	cd etcd && GOWORK=off $(GO) run ./cmd/dirscale -out $(CURDIR)/$(RESULTS)/directory
	{ echo "command: make results-directory (cd etcd && GOWORK=off go run ./cmd/epmesh -n 8,32,64 -dir mirror,ondemand -scenario mesh)"; \
	  cd etcd && GOWORK=off $(GO) run ./cmd/epmesh -n 8,32,64 -dir mirror,ondemand -scenario mesh -out $(CURDIR)/$(RESULTS)/directory/epmesh.json; } > $(RESULTS)/directory/epmesh.txt

.PHONY: debugpage-png
debugpage-png: ## results/debugpage.png: the debug page of a cache in every state, drawn by headless Chromium
	EPBENCH_SCREENSHOT=$(CURDIR)/$(RESULTS) $(GO) test -count=1 -run TestDebugPageInBrowser ./cmd/epbench

.PHONY: bench-smoke
bench-smoke: ## every benchmark once, so that none rots
	$(GO) test -run '^$$' -bench . -benchtime 1x $(PKGS)

.PHONY: bench
bench: ## the main job: epbench's default suite, every workload and comparator, each table as its workload ends (about a minute and a half on two cores)
	$(GO) run ./cmd/epbench

HITCOUNT    ?= 10
HITTIME     ?= 200ms

# go test -count N runs a benchmark's N runs one after another, so that a
# slow phase of a shared VM, seconds long, fell on one implementation's runs
# and not on its comparators' (cells of results/ came out 1.41 and 1.91 that
# way): bench-hit and results run -count 1 N times instead, which spreads
# every cell's runs over the whole measurement, interleaved with the others'.

.PHONY: bench-hit
bench-hit: ## the hit path and the lease, epcache called directly beside sync.Map, xsync v3, v4, a mutex pool, a reference count and the floor of a lease (a Get and two compare-and-swaps): GOMAXPROCS 1 and 2, 10 interleaved runs, benchstat (about 8 minutes)
	: > hit.out
	for i in $$(seq $(HITCOUNT)); do $(GO) test -run '^$$' -bench 'Benchmark(Hit|Lease)$$' -benchmem -cpu 1,2 -benchtime $(HITTIME) -count 1 ./bench/direct >> hit.out || exit 1; done
	$(GO) run $(BENCHSTAT) -col /impl hit.out

# BENCHTAGS are build tags for bench-ci's epbench. epcache_slowdemo builds
# the library with evictions made slower on purpose (epcache/slowdemo.go),
# which bench-ci must fail on: make bench-ci BENCHTAGS=epcache_slowdemo.
# baseline takes none.
BENCHTAGS   ?=

.PHONY: bench-ci
bench-ci: ## the short suite, compared with results/baseline.json by ratios measured in this run, and CPU per operation at GOMAXPROCS 1 in interleaved pairs (one to three minutes, as busy as the machine is; BENCHTAGS=epcache_slowdemo for the slowed build it must fail)
	$(GO) run -tags '$(BENCHTAGS)' ./cmd/epbench -suite ci -compare $(RESULTS)/baseline.json

.PHONY: baseline
baseline: ## rewrite this machine's runs in results/baseline.json (three runs of the short suite, three times bench-ci's pairs), keeping other machines'
	$(GO) run ./cmd/epbench -suite ci -count 3 -format json -keep $(RESULTS)/baseline.json > $(RESULTS)/baseline.json.tmp
	mv $(RESULTS)/baseline.json.tmp $(RESULTS)/baseline.json

.PHONY: results
results: ## the full measurement into results/: go test -cpu 1,2,4,8, 10 interleaved runs, epbench -count 5 (and tcpstorm at rtt 5ms, 20ms), benchstat, charts, HTML reports (results/epbench/index.html), READMEs (about 40 minutes)
	mkdir -p $(RESULTS)/epbench
	{ echo "$$(nproc) × $$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $$(free -g | awk '/Mem:/ {print $$2}') GiB, $$($(GO) version | cut -d' ' -f3-)"; \
	  echo "cpus: $$(nproc)"; echo "cpu: $$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"; \
	  echo "memory: $$(free -g | awk '/Mem:/ {print $$2}') GiB"; echo "kernel: $$(uname -srm)"; \
	  echo "go: $$($(GO) version)"; echo "date: $$(date -u '+%Y-%m-%d %H:%M UTC')"; \
	  echo "commit: $$(git rev-parse --short HEAD 2>/dev/null)"; } > $(RESULTS)/machine.txt
	printf '%s\n' \
	  "for i in \$$(seq $(GOBENCH_RUNS)); do $(GO) test -run '^\$$' -bench . -benchmem -cpu 1,2,4,8 -count 1 -benchtime 100ms ./epcache ./shard ./bench ./bench/direct >> $(RESULTS)/gobench.txt; done" \
	  "$(GO) run $(BENCHSTAT) -col /impl $(RESULTS)/gobench.txt > $(RESULTS)/benchstat.txt" \
	  "$(GO) run ./cmd/epbench -count 5 -out $(RESULTS)/epbench" \
	  "$(GO) run ./cmd/epbench $(RTT_RUNS) -count 5 -out $(RESULTS)/epbench-rtt" \
	  "$(GO) run ./internal/resultsdoc -results $(RESULTS) -readme README.md" > $(RESULTS)/commands.txt
	: > $(RESULTS)/gobench.txt
	for i in $$(seq $(GOBENCH_RUNS)); do $(GO) test -run '^$$' -bench . -benchmem -cpu 1,2,4,8 -count 1 -benchtime 100ms ./epcache ./shard ./bench ./bench/direct >> $(RESULTS)/gobench.txt || exit 1; done
	$(GO) run $(BENCHSTAT) -col /impl $(RESULTS)/gobench.txt > $(RESULTS)/benchstat.txt
	$(GO) run ./cmd/epbench -count 5 -out $(RESULTS)/epbench
	$(GO) run ./cmd/epbench $(RTT_RUNS) -count 5 -out $(RESULTS)/epbench-rtt
	$(GO) run ./internal/resultsdoc -results $(RESULTS) -readme README.md

GOBENCH_RUNS := 10

# tcpstorm at the longer modelled round trips, beside the default suite's 0
# and 1ms, with either kind of context.
RTT_RUNS := -workload tcpstorm -keys uint64 -peers 32 -goroutines 8 -rtt 5ms,20ms -ctx background,cancel

FUZZTIME        ?= 10s
STRESS_FUZZTIME ?= 3m

# FUZZTIME is a duration or a count of inputs (20000x). CI gives a count: a
# duration can end in a spurious "context deadline exceeded" under Go 1.26
# (go.dev/issue/75804).
.PHONY: fuzz-short
fuzz-short: ## run each fuzz target for FUZZTIME (10s, or a count such as 20000x) from its seed corpus in testdata/fuzz
	$(GO) test -run '^$$' -fuzz '^FuzzCache$$' -fuzztime $(FUZZTIME) ./epcache
	$(GO) test -run '^$$' -fuzz '^FuzzTable$$' -fuzztime $(FUZZTIME) ./shard

.PHONY: stress
stress: ## the long campaigns (about 15 minutes): linearizability, faults, fuzzing for STRESS_FUZZTIME (3m), growth, a million peers
	$(GO) test -race -count=1 -timeout 60m -run 'TestFault|TestStress' ./epcache -long
	$(GO) test -race -count=1 -timeout 60m -run 'TestLinearizability' ./internal/lincheck -long
	$(MAKE) fuzz-short FUZZTIME=$(STRESS_FUZZTIME)
	$(GO) test -race -count=1 -timeout 30m -run 'TestConcurrentGrowthAndClaims|TestSealDuringRebuild|TestFlood|TestGrowthNeverBlocksReaders' ./shard
	$(GO) test -count=1 -timeout 30m -run 'TestGrowthNeverBlocksReaders|TestMillionPeers' ./epcache ./shard
	$(GO) test -race -count=1 -timeout 30m -run 'TestMillionPeers' ./epcache -long

# UCX: the ucx build tag needs cgo and libucx-dev (apt-get install libucx-dev).
# `make test` does not need them; CI runs test-ucx after it.
UCX_PKGS    := ./transport/ucx/... ./bench/...

.PHONY: test-ucx
test-ucx: ## UCX transport and ucxstorm with -tags ucx: vet, staticcheck, race tests, benchmarks once (needs libucx-dev)
	$(GO) vet -tags ucx $(UCX_PKGS)
	$(GO) run $(STATICCHECK) -tags ucx $(UCX_PKGS)
	$(GO) test -tags ucx -race -count=1 $(UCX_PKGS)
	$(GO) test -tags ucx -run '^$$' -bench . -benchtime 1x ./transport/ucx/...

.PHONY: results-ucx
results-ucx: ## ucxstorm at 16 peers, rtt 0 and 1ms, medians of 5, into results/ucxstorm.txt, machine and command first (needs libucx-dev; a minute)
	{ echo "$$(nproc) × $$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), UCX $$(dpkg-query -W -f='$${Version}' libucx-dev 2>/dev/null || echo unknown), $$($(GO) version | cut -d' ' -f3-); command: $(GO) run -tags ucx ./cmd/epbench -workload ucxstorm -keys uint64 -peers 16 -rtt 0,1ms -count 5"; \
	  $(GO) run -tags ucx ./cmd/epbench -workload ucxstorm -keys uint64 -peers 16 -rtt 0,1ms -count 5; } > $(RESULTS)/ucxstorm.txt.tmp
	mv $(RESULTS)/ucxstorm.txt.tmp $(RESULTS)/ucxstorm.txt
