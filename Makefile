# jetflow — run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
# The Go release jetflow is built and tested with. Whatever Go 1.26 or
# later runs make, the go command fetches this one from the module proxy
# the first time (about 76 MB) and uses it: its encoding/json and
# runtime measured 6-16% less CPU a step with agents than Go 1.26's
# (docs/benchmarks.md, "Built with Go 1.27"). The modules still declare
# Go 1.26, the oldest they build with, and test/go1.26 tests what differs
# there. GOTOOLCHAIN set in the environment (local, say) wins: make test
# says so. go.work's toolchain line and the Dockerfile's GO_VERSION name
# the same release (make lint checks).
GO_RELEASE ?= go1.27.3
export GOTOOLCHAIN ?= $(GO_RELEASE)
# The release the go command runs here, and its gofmt. ($(shell) is not
# given make's exported variables before GNU make 4.4: name it.)
GO_VERSION := $(shell GOTOOLCHAIN=$(GOTOOLCHAIN) $(GO) env GOVERSION)
GOFMT = "$$(GOTOOLCHAIN=$(GOTOOLCHAIN) $(GO) env GOROOT)/bin/gofmt"
# Every module of the workspace, as import-path patterns (./... at the root
# does not reach the other workspace modules).
PKGS := $(shell GOTOOLCHAIN=$(GOTOOLCHAIN) $(GO) list -m -f '{{.Path}}/...')
DIRS := $(shell GOTOOLCHAIN=$(GOTOOLCHAIN) $(GO) list -m -f '{{.Dir}}')
DATA ?= .jetflow
TEST_TIMEOUT ?= 15m
CHAOS_COUNT ?= 3
# make chaos: executions started, at CHAOS_RATE per second, and SIGKILLs
# of each kind of process (cluster: node kills).
CHAOS_EXECUTIONS ?= 1000
CHAOS_RATE ?= 20
# The linter's version, and where make lint installs it (gitignored): a
# linter type-checks with the Go it was built with, so each Go release
# gets its own build.
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT_DIR := $(CURDIR)/bin/tools/golangci-lint-$(GOLANGCI_LINT_VERSION)-$(GO_VERSION)
GOLANGCI_LINT ?= $(GOLANGCI_LINT_DIR)/golangci-lint
# make cover writes its merged profile here (gitignored).
COVER_DIR ?= .cover

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show the targets
	@grep -hE '^[a-zA-Z0-9_./-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  %-22s %s\n", $$1, $$2}'

# The version make build stamps into the binaries (svc.Version): Go does
# not stamp the commit into binaries built in a workspace.
VERSION ?= $(shell git describe --always --dirty --tags 2>/dev/null)
LDFLAGS := -X jetflow.dev/pkg/svc.stamped=$(VERSION)
# The commit jetflow version -o json reports, for the same reason.
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)

.PHONY: build
build: ## Build the jetflow CLI, jetflow-bench, jetflow-chaos, nats-server and the four service binaries into bin/
	@mkdir -p bin
	$(GO) build -ldflags "$(LDFLAGS) -X jetflow.dev/tools/internal/cli.stampedCommit=$(COMMIT)" -o bin/jetflow ./tools/cmd/jetflow
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/jetflow-bench ./tools/cmd/jetflow-bench
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/jetflow-chaos ./tools/cmd/jetflow-chaos
	$(GO) build -o bin/nats-server github.com/nats-io/nats-server/v2
	@for s in api dispatcher agent janitor; do echo "$(GO) build -ldflags \"$(LDFLAGS)\" -o bin/jetflow-$$s ./services/$$s"; $(GO) build -ldflags "$(LDFLAGS)" -o bin/jetflow-$$s ./services/$$s || exit 1; done

.PHONY: image
image: ## Build the container images jetflow:VERSION and jetflow-agent:VERSION (deployments/Dockerfile; needs docker)
	docker build -f deployments/Dockerfile --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t jetflow:$(VERSION) .
	docker build -f deployments/Dockerfile --target agent --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t jetflow-agent:$(VERSION) .

.PHONY: dev
dev: build ## Run embedded NATS + all four services (data in DATA, .jetflow; api on HTTP, NATS on NATS, metrics on METRICS; more flags of jetflow dev in DEV_FLAGS), examples registered
	bin/jetflow dev --data $(DATA) --apply examples $(if $(HTTP),--http $(HTTP)) $(if $(NATS),--nats-addr $(NATS)) $(if $(METRICS),--metrics-addr $(METRICS)) $(DEV_FLAGS)

# Every fuzz target, as directory:Name. make fuzz fuzzes each for
# FUZZTIME; make test for FUZZ_SHORT each, after the tests.
FUZZ_TARGETS := ./pkg/bus:FuzzDecode ./pkg/bus:FuzzDirectDecode ./pkg/projections:FuzzFold ./pkg/projections:FuzzStoredHead \
	./pkg/workflow:FuzzParse ./pkg/workflow:FuzzYAMLKeepsText ./pkg/retention:FuzzParse ./pkg/startcheck:FuzzCheck \
	./pkg/events:FuzzNameRules ./pkg/events:FuzzReadWhole ./services/api/api:FuzzRequest ./services/dispatcher/dispatch:FuzzCommand
FUZZTIME ?= 200000x
FUZZ_SHORT ?= 2000x
# FUZZ_RUN fuzzes every target in turn for the time given ($(1)), and
# stops at the first that fails (its input is written to the package's
# testdata/fuzz: commit it as a regression seed once fixed).
define FUZZ_RUN
	@for t in $(FUZZ_TARGETS); do \
		dir=$${t%%:*}; name=$${t##*:}; \
		echo "$(GO) test $$dir -run '^\$$' -fuzz '^$$name\$$' -fuzztime $(1)"; \
		$(GO) test $$dir -run '^$$' -fuzz "^$$name\$$" -fuzztime $(1) || exit 1; \
	done
endef

.PHONY: test
test: ## Every module's tests with -race against embedded JetStream, test/go1.26, then every fuzz target for FUZZ_SHORT (2000 inputs) each
	@if [ "$(GO_VERSION)" != "$(GO_RELEASE)" ]; then echo "make test: testing with $(GO_VERSION), not $(GO_RELEASE) (GOTOOLCHAIN=$(GOTOOLCHAIN) in the environment)"; fi
	$(GO) version
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)
	$(MAKE) --no-print-directory test/go1.26
	$(call FUZZ_RUN,$(FUZZ_SHORT))

# The oldest Go the modules declare. Its encoding/json is the v1
# implementation, whose answers to bad JSON differ from the v2 one's
# (the member an error names: docs/development.md): the packages that
# explain bad JSON are tested with it too, so that a program built with
# Go 1.26 on jetflow's modules says what the tests expect. (Go 1.27's
# GOEXPERIMENT=nojsonv2 cannot stand in: dependencies build on
# encoding/json/v2 from Go 1.27.)
GO_OLDEST ?= go1.26.8
JSONV1_PKGS := jetflow.dev/pkg/events/... jetflow.dev/pkg/bus/... jetflow.dev/pkg/projections/... \
	jetflow.dev/pkg/startcheck/... jetflow.dev/services/api/api
.PHONY: test/go1.26
test/go1.26: ## go vet of pkg and the packages that explain bad JSON, built with Go 1.26 (GO_OLDEST: encoding/json's v1 implementation)
	GOTOOLCHAIN=$(GO_OLDEST) $(GO) version
	GOTOOLCHAIN=$(GO_OLDEST) $(GO) vet jetflow.dev/pkg/...
	GOTOOLCHAIN=$(GO_OLDEST) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(JSONV1_PKGS)

.PHONY: cover
cover: ## Every module's tests with coverage: a table per package and the total; merged profile in $(COVER_DIR)/cover.out
	@mkdir -p $(COVER_DIR)
	@rm -f $(COVER_DIR)/cover.out
	@status=0; $(GO) test -count=1 -covermode=atomic -coverprofile=$(COVER_DIR)/cover.out -timeout $(TEST_TIMEOUT) $(COVER_FLAGS) $(PKGS) || status=$$?; \
	if [ -s $(COVER_DIR)/cover.out ]; then \
		echo; awk "$$COVER_AWK" $(COVER_DIR)/cover.out | tee $(COVER_DIR)/cover.txt; \
		echo "merged profile: $(COVER_DIR)/cover.out (go tool cover -html=$(COVER_DIR)/cover.out)"; \
	fi; exit $$status

# COVER_AWK sums a merged profile's statements per package (a block listed
# by more than one test binary counts once, covered if any covered it).
define COVER_AWK
NR == 1 { next }
{
	key = $$1; pkg = $$1; sub(/:.*/, "", pkg); sub(/\/[^\/]*$$/, "", pkg)
	if (!(key in stmts)) { stmts[key] = $$2; pkgof[key] = pkg }
	if ($$3 > 0) hit[key] = 1
}
END {
	for (k in stmts) {
		all[pkgof[k]] += stmts[k]; total += stmts[k]
		if (k in hit) { cov[pkgof[k]] += stmts[k]; covered += stmts[k] }
	}
	printf "%-52s %8s %7s\n", "PACKAGE", "STMTS", "COVER"
	for (p in all) if (all[p] > 0) printf "%-52s %8d %6.1f%%\n", p, all[p], 100 * cov[p] / all[p] | "sort"
	close("sort")
	if (total > 0) printf "%-52s %8d %6.1f%%\n", "total", total, 100 * covered / total
}
endef
export COVER_AWK

.PHONY: chaos
chaos: build ## Chaos suite: CHAOS_EXECUTIONS (1000) mixed executions, nats-server and each service SIGKILLed 5 times; every history checked
	bin/jetflow-chaos -bin bin -executions $(CHAOS_EXECUTIONS) -rate $(CHAOS_RATE) $(CHAOS_FLAGS)

.PHONY: chaos/cluster
chaos/cluster: build ## Failure drills on a 3-node cluster (2 api, 2 dispatcher, 2 agent): each leader, node, service killed once, a dispatcher starved; stalls, failed requests, runs twice
	bin/jetflow-chaos -bin bin -mode drills $(CHAOS_FLAGS)

.PHONY: chaos/cluster-random
chaos/cluster-random: build ## Chaos suite on a 3-node cluster: CHAOS_EXECUTIONS mixed executions, one node at a time SIGKILLed (the stream leader every other time)
	bin/jetflow-chaos -bin bin -mode cluster -executions $(CHAOS_EXECUTIONS) -rate $(CHAOS_RATE) $(CHAOS_FLAGS)

.PHONY: chaos/locks
chaos/locks: ## SIGKILL dispatchers and agents under lock contention, CHAOS_COUNT times (3)
	$(GO) test -race -count=$(CHAOS_COUNT) -timeout $(TEST_TIMEOUT) -run '^TestLocksUnderSIGKILL$$' jetflow.dev/tools/e2e

.PHONY: deps/browser
deps/browser: ## Install Chromium for the UI's browser tests (Debian/Ubuntu, only when no Chromium is found)
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null; then \
		echo "Chromium is installed"; \
	elif command -v apt-get >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium; \
		else sudo sh -c 'apt-get update -qq && apt-get install -y -qq chromium'; fi; \
	else echo "install Chromium with your package manager, or set JETFLOW_CHROMIUM to its path"; exit 1; fi

.PHONY: deps/postgres
deps/postgres: ## Install PostgreSQL for the visibility index's PostgreSQL tests (Debian/Ubuntu, only when no server is found)
	@if command -v pg_ctl >/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then \
		echo "PostgreSQL is installed"; \
	elif command -v apt-get >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq postgresql; \
		else sudo sh -c 'apt-get update -qq && apt-get install -y -qq postgresql'; fi; \
	else echo "install PostgreSQL with your package manager, or set JETFLOW_TEST_POSTGRES to a server's URL"; exit 1; fi

.PHONY: test/postgres
test/postgres: ## The visibility index's tests against a throwaway PostgreSQL server (tools/ci/postgres.sh), started and stopped here
	@out=$$(tools/ci/postgres.sh start) || exit 1; eval "$$out"; trap 'tools/ci/postgres.sh stop "$$JETFLOW_POSTGRES_DIR"' EXIT; \
		export JETFLOW_TEST_POSTGRES JETFLOW_REQUIRE_POSTGRES=1; \
		$(GO) test -race -count=1 jetflow.dev/services/api/visibility/... && \
		$(GO) test -race -count=1 -run 'Visibility|Counts|Rebuild|Config' jetflow.dev/services/api/api

.PHONY: docs/screenshots
docs/screenshots: ## Remake docs/img/ui-*.png from the UI's browser test (needs Chromium)
	@mkdir -p docs/img
	JETFLOW_REQUIRE_BROWSER=1 JETFLOW_UI_SCREENSHOTS=$(CURDIR)/docs/img $(GO) test -count=1 -run '^TestOperatorUIInABrowser$$' ./tools/e2e

.PHONY: test/short
test/short: ## Quick tests (skips the crash and end-to-end tests)
	$(GO) test -short -count=1 $(PKGS)

.PHONY: fuzz
fuzz: ## Fuzz every target (decoding, folding, parsing, name rules, definitions as YAML, retention, start checks, api requests, dispatcher commands) for FUZZTIME each: a count like 200000x or a duration
	$(call FUZZ_RUN,$(FUZZTIME))

.PHONY: fuzz/short
fuzz/short: ## Fuzz every target for FUZZ_SHORT (2000 inputs) each, as make test does after the tests
	$(call FUZZ_RUN,$(FUZZ_SHORT))

.PHONY: bench
bench: ## Benchmark: 10-step noop executions through all four services (steps/s, p99/p50, CPU per step), one at a time, 1-step ones; a table against the speed goals
	$(GO) run ./tools/cmd/jetflow-bench $(BENCH_FLAGS)

.PHONY: bench/local
bench/local: ## Benchmark as make bench, with the noop steps local (local: true): run by the dispatcher, one append per step, no agent
	$(GO) run ./tools/cmd/jetflow-bench -local $(BENCH_FLAGS)

.PHONY: bench/timers
bench/timers: ## Benchmark TIMERS executions (10000) sleeping until the same instant: how late their timers fire (p99)
	$(GO) run ./tools/cmd/jetflow-bench -executions 0 -single 0 -single1 0 -timers $(or $(TIMERS),10000) $(BENCH_FLAGS)

.PHONY: bench/sleepers
bench/sleepers: ## Benchmark SLEEPERS executions (100000) asleep for an hour: RSS and goroutines per sleeping execution
	$(GO) run ./tools/cmd/jetflow-bench -executions 0 -single 0 -single1 0 -sleepers $(or $(SLEEPERS),100000) $(BENCH_FLAGS)

.PHONY: bench/fsync
bench/fsync: ## Benchmark as make bench, with JetStream fsyncing every write (sync_interval: always)
	$(GO) run ./tools/cmd/jetflow-bench -fsync $(BENCH_FLAGS)

.PHONY: bench/fsync-group
bench/fsync-group: ## Benchmark as make bench/fsync, the dispatcher writing in atomic batches (-group-commit, docs/adr/0020)
	$(GO) run ./tools/cmd/jetflow-bench -fsync -group-commit $(BENCH_FLAGS)

# make bench/compare builds jetflow-bench from commit OLD (in a
# temporary worktree) and from the working tree, and runs them in PAIRS
# alternating pairs with BENCH_FLAGS (docs/benchmarks.md, "Comparing two
# commits"). BENCH_NEW=<commit> builds the new side from a commit too.
OLD ?= HEAD~1
PAIRS ?= 8

.PHONY: bench/compare
bench/compare: ## Compare the working tree (or BENCH_NEW) with commit OLD (HEAD~1): PAIRS (8) alternating pairs of jetflow-bench BENCH_FLAGS, and which differences the noise does not explain
	@set -e; for rev in "$(OLD)" $(BENCH_NEW); do \
		git rev-parse --verify --quiet "$$rev^{commit}" >/dev/null || { echo "bench/compare: $$rev names no commit (OLD=<commit>, BENCH_NEW=<commit>)" >&2; exit 2; }; \
	done; \
	tmp=$$(mktemp -d); \
	trap 'git worktree remove --force "$$tmp/old" >/dev/null 2>&1 || true; git worktree remove --force "$$tmp/new" >/dev/null 2>&1 || true; rm -rf "$$tmp"' EXIT; \
	git worktree add --quiet --detach "$$tmp/old" "$(OLD)"; \
	(cd "$$tmp/old" && $(GO) build -o "$$tmp/old-bench" ./tools/cmd/jetflow-bench); \
	if [ -n "$(BENCH_NEW)" ]; then \
		git worktree add --quiet --detach "$$tmp/new" "$(BENCH_NEW)"; \
		(cd "$$tmp/new" && $(GO) build -o "$$tmp/new-bench" ./tools/cmd/jetflow-bench); \
	else $(GO) build -o "$$tmp/new-bench" ./tools/cmd/jetflow-bench; fi; \
	$(GO) build -o "$$tmp/compare" ./tools/cmd/jetflow-benchcompare; \
	mkdir -p "$(or $(BENCH_LOG),bench-compare)"; \
	"$$tmp/compare" -old "$$tmp/old-bench" -new "$$tmp/new-bench" -pairs $(PAIRS) -log "$(or $(BENCH_LOG),bench-compare)" -- $(BENCH_FLAGS)

# The Go benchmarks of the interpreter's decision, the fold, the
# janitor's retention decision, the visibility index's reading of a
# read model and the projector (encoding a model; the read models' lag
# at steady rates, about a minute), run by make bench/go only (make test
# compiles them, but runs no benchmark).
GO_BENCH_PKGS := ./services/dispatcher/interp ./pkg/projections ./services/janitor/janitor ./services/api/visibility ./services/api/projector
GO_BENCH_TIME ?= 1s

.PHONY: bench/go
bench/go: ## Go benchmarks of the interpreter's decision, the fold, retention's decision, a janitor's sweep over tasks in flight, reading and encoding read models (ns/op, allocs/op; GO_BENCH_TIME each, 1s), and the read models' lag at steady rates
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(GO_BENCH_TIME) $(GO_BENCH_PKGS)

.PHONY: bench/failover
bench/failover: ## Benchmark failover: three dispatchers, one cut off while FAILOVER executions (30) run; reports the longest pause
	$(GO) run ./tools/cmd/jetflow-bench -executions 0 -single 0 -single1 0 -failover $(or $(FAILOVER),30) $(BENCH_FLAGS)

.PHONY: bench/foreach
bench/foreach: ## Benchmark one execution of a foreach over FOREACH let items (5000), which the dispatcher runs itself
	$(GO) run ./tools/cmd/jetflow-bench -executions 0 -single 0 -single1 0 -foreach $(or $(FOREACH),5000) $(BENCH_FLAGS)

.PHONY: bench/loop
bench/loop: ## Benchmark LOOP executions (4) of a goto loop of 1000 rounds at once: how long a round takes at the start, the middle and the end of the loop
	$(GO) run ./tools/cmd/jetflow-bench -executions 0 -single 0 -single1 0 -loop $(or $(LOOP),4) $(BENCH_FLAGS)

.PHONY: bench/fairness
bench/fairness: ## Benchmark fairness: 3-step executions idle and while one foreach of FAIRNESS noop operations (3000) runs; reports how far their p99 rises (BENCH_FLAGS=-fairness-sleep 1s: slow exec operations)
	$(GO) run ./tools/cmd/jetflow-bench -executions 0 -single 0 -single1 0 -fairness $(or $(FAIRNESS),3000) $(BENCH_FLAGS)

.PHONY: bench/retention
bench/retention: ## Benchmark the janitor's retention sweep over RETENTION finished executions (5000; 2/5 deleted, or all but RETENTION_KEEP)
	$(GO) run ./tools/cmd/jetflow-bench -executions 0 -single 0 -single1 0 -retention $(or $(RETENTION),5000) $(if $(RETENTION_KEEP),-retention-keep $(RETENTION_KEEP)) $(BENCH_FLAGS)

.PHONY: bench/backup
bench/backup: ## Benchmark backup and restore: BACKUP executions (10000) of 10 noop steps, then a backup, a restore into a new server and a re-projection
	$(GO) run ./tools/cmd/jetflow-bench -executions $(or $(BACKUP),10000) -single 0 -single1 0 -backup $(BENCH_FLAGS)

.PHONY: bench/visibility
bench/visibility: ## Benchmark the visibility index: fill it with VISIBILITY executions (1000000), then p50/p99 of filtered pages, cursors, time ranges, attributes and counts, its size and the process's RSS; in PostgreSQL with VISIBILITY_POSTGRES=<url>
	$(GO) run ./tools/cmd/jetflow-bench -visibility $(or $(VISIBILITY),1000000) $(if $(VISIBILITY_POSTGRES),-visibility-postgres '$(VISIBILITY_POSTGRES)') $(BENCH_FLAGS)

.PHONY: soak
soak: ## Soak: a steady mixed load for DURATION (10m) at RATE executions/s (10); rows of latency, memory, goroutines; a leak verdict
	$(GO) run ./tools/cmd/jetflow-bench -soak $(or $(DURATION),10m) $(if $(RATE),-soak-rate $(RATE)) $(SOAK_FLAGS)

.PHONY: lint
lint: $(GOLANGCI_LINT) ## gofmt, go vet, golangci-lint (.golangci.yml: the architecture's import rules, errors, staticcheck) over every module, and the deployment manifests (offline)
	@test "$$(sed -n 's/^toolchain //p' go.work)" = "$(GO_RELEASE)" || { echo "go.work's toolchain line is not $(GO_RELEASE) (GO_RELEASE)"; exit 1; }
	@grep -qx 'ARG GO_VERSION=$(patsubst go%,%,$(GO_RELEASE))' deployments/Dockerfile || { echo "deployments/Dockerfile's GO_VERSION is not $(patsubst go%,%,$(GO_RELEASE)) (GO_RELEASE)"; exit 1; }
	@out=$$($(GOFMT) -l $(DIRS)); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run ./tools/cmd/jetflow-manifests deployments
	@for d in $(DIRS); do echo "golangci-lint $$d"; (cd $$d && $(GOLANGCI_LINT) run --allow-parallel-runners --timeout 15m ./...) || exit 1; done

# golangci-lint, pinned, built once into bin/tools by the module proxy.
$(GOLANGCI_LINT):
	@mkdir -p $(dir $@)
	GOBIN=$(GOLANGCI_LINT_DIR) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

.PHONY: fmt
fmt: ## Format all Go files
	$(GOFMT) -w $(DIRS)

.PHONY: tidy
tidy: ## go mod tidy in every module
	@for d in $(DIRS); do (cd $$d && $(GO) mod tidy) || exit 1; done

.PHONY: clean
clean: ## Remove binaries, the dev data directory and coverage profiles
	rm -rf bin $(DATA) $(COVER_DIR)
