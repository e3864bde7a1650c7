# Cube — run `make help` for the list of targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
export PATH := /usr/local/go/bin:$(HOME)/go/bin:$(PATH)

BIN        ?= bin
DATA_DIR   ?= /var/lib/cube
LISTEN     ?= 127.0.0.1:3000
GO_TEST    ?= go test -count=1
CUBE_CACHE_DIR ?= /var/cache/cube
export CUBE_CACHE_DIR

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps
deps: ## Install what builds and tests need (apt packages, npm SDK); idempotent.
	@bash hack/deps.sh

.PHONY: build
build: ## Build bin/cube and the static bin/envd, bin/cube-shim, bin/cube-supervisor and bin/cube-interp, and the static C programs bin/cube-nsexec and bin/cube-reaper (gcc).
	@mkdir -p $(BIN)
	go build -o $(BIN)/cube ./cmd/cube
	CGO_ENABLED=0 go build -ldflags='-s -w' -o $(BIN)/envd ./cmd/envd
	CGO_ENABLED=0 go build -ldflags='-s -w' -o $(BIN)/cube-shim ./cmd/cube-shim
	CGO_ENABLED=0 go build -ldflags='-s -w' -o $(BIN)/cube-supervisor ./cmd/cube-supervisor
	CGO_ENABLED=0 go build -ldflags='-s -w' -o $(BIN)/cube-interp ./cmd/cube-interp
	gcc -static -O2 -s -Wall -Werror -o $(BIN)/cube-nsexec cmd/cube-nsexec/nsexec.c
	gcc -static -O2 -s -Wall -Werror -o $(BIN)/cube-reaper cmd/cube-reaper/reaper.c

IMAGES_OUT ?= out/images
.PHONY: images
images: ## Build the OCI image layouts under out/images/<name> without Docker (Debian by debootstrap + static binaries; root, cached), then check them.
	go run ./hack/images -out $(IMAGES_OUT)
	$(GO_TEST) ./hack/images

.PHONY: generate
generate: ## Regenerate protobuf/Connect code (committed).
	@bash hack/generate.sh

.PHONY: check-generate
check-generate: generate ## Fail when committed generated code is stale.
	@git add -N api/gen && git diff --exit-code -- api/gen || { echo "generated code is stale: run make generate and commit"; exit 1; }

.PHONY: fresh-check
fresh-check: ## In a fresh Debian root (chroot): a fresh clone of HEAD runs make deps, check-generate, build (~5-8 min).
	bash hack/fresh-machine-check.sh

.PHONY: up
up: deps build ## Start all-in-one Cube on this machine (server + cubelet, SQLite, template base).
	$(BIN)/cube up --listen $(LISTEN) --data-dir $(DATA_DIR)

.PHONY: vet
vet: ## go vet every package.
	go vet ./...

.PHONY: unit
unit: ## Unit and integration tests (root: real namespaces, nftables, cgroups; envtest kube-apiserver).
	KUBEBUILDER_ASSETS="$$(bash hack/kube-test-assets.sh)" $(GO_TEST) -timeout 30m $$(go list ./... | grep -v /test/kubereal)
	# Built without cgo, pid 1 of a sandbox without a reaper binary drops every thread's capabilities
	# (AllThreadsSyscall); with cgo (above) the test can check only the reaping thread.
	CGO_ENABLED=0 $(GO_TEST) -run 'TestUserNamespace' ./internal/nsrt

.PHONY: unit-nonroot
unit-nonroot: ## The same tests as an unprivileged user: pure tests run, root-only ones SKIP with a reason (~10 min cold; not in test).
	bash hack/unit-nonroot.sh

.PHONY: kube-assets
kube-assets: ## Build kube-apiserver and etcd for envtest from the Go module proxy (cached by version; 6-13 min cold).
	@bash hack/kube-test-assets.sh

.PHONY: kube-node-assets
kube-node-assets: ## Build kubelet, kube-proxy, ..., kubectl, helm, CoreDNS and pause for the local cluster (cached by version).
	@bash hack/kube-node-assets.sh

.PHONY: kube-up
kube-up: deps ## Start a local single-node Kubernetes with Cube installed (docs/kubernetes/local-cluster.md).
	@mkdir -p $(BIN)
	@go build -o $(BIN)/kubelocal ./hack/kubelocal
	$(BIN)/kubelocal up

.PHONY: kube-down
kube-down: ## Remove the local cluster and restore the host (idempotent).
	@mkdir -p $(BIN)
	@go build -o $(BIN)/kubelocal ./hack/kubelocal
	$(BIN)/kubelocal down

.PHONY: kubereal
kubereal: ## Real-cluster suite (test/kubereal): make kube-up, the suite against it, then make kube-down (always).
	@status=0; \
	$(MAKE) --no-print-directory kube-up && \
	$(GO_TEST) -timeout 60m -v ./test/kubereal 2>&1 | tee kubereal.log | grep -E '^(=== RUN|--- |\s+--- |ok |FAIL|PASS)|TIMING' ; \
	status=$${PIPESTATUS[0]}; [[ -n "$$status" ]] || status=1; \
	$(MAKE) --no-print-directory kube-down || { [[ $$status != 0 ]] || status=1; }; \
	[[ $$status == 0 ]] || { echo "kubereal failed; its whole output (kubereal.log):"; cat kubereal.log; }; \
	exit $$status

.PHONY: e2e
e2e: build ## End-to-end suite: official e2b npm SDK against `cube up`, then against server + 2 cubelets.
	bash test/e2e/run.sh $(BIN)/cube
	CUBE_E2E_MODE=cluster bash test/e2e/run.sh $(BIN)/cube

# The fresh-machine check runs under CI=true (CI's machines are fresh; a
# developer's is not, which is the point of the check): make FRESH_CHECK=1 test.
FRESH_CHECK ?= $(if $(CI),1,)
.PHONY: test
test: deps build vet check-generate $(if $(FRESH_CHECK),fresh-check,) unit e2e kubereal ## Everything CI runs.
	@echo "make test: all suites passed"

BENCH_FLAGS ?=
.PHONY: bench
bench: build ## Benchmark a fresh all-in-one Cube (~10 min, not part of test); writes bench-results.json. Extra flags: BENCH_FLAGS=...
	CGO_ENABLED=0 go build -ldflags='-s -w' -o $(BIN)/benchfloor ./cmd/benchfloor
	bash test/bench/run.sh $(BIN)/cube bench-results.json $(BENCH_FLAGS)

.PHONY: fuzz
fuzz: ## Longer fuzzing runs of every fuzz target.
	bash hack/fuzz.sh 60s

.PHONY: clean
clean: ## Remove build output.
	rm -rf $(BIN)
