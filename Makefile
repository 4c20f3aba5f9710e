# epcache: run `make` (or `make help`) for the list of targets.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
PKGS        := ./...
BENCHTIME   ?= 1s
COUNT       ?= 1

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: test
test: fmt-check vet lint race test-386 bench-smoke ## everything CI checks: gofmt, vet, staticcheck, race tests, 32-bit, benchmarks once

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

.PHONY: test-386
test-386: ## the core packages' tests as a 32-bit program
	GOARCH=386 $(GO) test -short -count=1 ./shard ./epcache

.PHONY: bench-smoke
bench-smoke: ## every benchmark once, so that none rots
	$(GO) test -run '^$$' -bench . -benchtime 1x $(PKGS)

.PHONY: bench
bench: ## hit-path benchmarks of epcache beside sync.Map and xsync (BENCHTIME=1s COUNT=1)
	$(GO) test -run '^$$' -bench 'Hit' -benchmem -benchtime $(BENCHTIME) -count $(COUNT) ./epcache ./shard
