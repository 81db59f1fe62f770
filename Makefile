# eventpipe: the two commands a new user needs are `make run` and `make test`.
# Everything the tests use (kube-apiserver, etcd, VictoriaLogs) is built here
# from Go modules into $(BIN) (git-ignored), reusing the Go build cache.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
BIN ?= $(ROOT)/.bin
export EVENTPIPE_BIN_DIR := $(BIN)
GO ?= go
# -p 4: four test packages at a time on 2 cores, because the tests wait more
# than they compute (control planes starting, Events arriving, the kubelet's
# back-offs). At go test's default (one package per core) the warm test phase
# took 673 s and the cores were about half idle; at -p 4 it took 477 s, the
# cores 83% busy (bench/build.md, CI18 and CI19). It does not crowd the
# compiler: `make vet` has compiled every package with the same flags before,
# so go test mostly links and runs.
GOTEST_FLAGS ?= -race -count=1 -timeout 30m -p 4
# The compiler and linker of `make test` run with GOGC=400: fewer collections
# cut a cold build's CPU time by about 10% (bench/build.md). It goes through
# -toolexec so that only the toolchain gets it, never a test binary or a
# process a test starts (some tests measure memory), and the build cache is
# shared with plain builds (the tools' IDs do not change).
TOOLGC := -toolexec 'env GOGC=400'

VICTORIALOGS_VERSION := v1.52.2
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2

.PHONY: all build run test tools kube-tools victoria-logs h2peer proto proto-tools vet fmt bench dev-cluster clean

all: build

# gobuild OUT,PKG: go build with a line before and after (with how long it
# took) and a heartbeat every 30 s in between: a cold build of the demo
# compiles Kubernetes for minutes, and silence looks like a hang. It builds
# with the release image's flags (no cgo, -trimpath), as testenv/evbin does
# for the tests: the binary is the kind that ships, and one compile serves
# this build, the tests' and the image's. The
# heartbeat kills its own sleep when stopped: a sleep left running would hold
# make's stdout open for up to 30 s after the build (a pipe reader waits).
define gobuild
	@echo "build: $(1) ($(2)) ..."; start=$$(date +%s); \
	( trap 'kill $$s 2>/dev/null; exit 0' TERM; \
	  while :; do sleep 30 & s=$$!; wait $$s; echo "build: $(notdir $(1)) still compiling, $$(( $$(date +%s) - start ))s"; done ) & hb=$$!; \
	trap 'kill $$hb 2>/dev/null || true' EXIT; \
	CGO_ENABLED=0 $(GO) build -trimpath -o $(1) $(2); \
	echo "build: $(1) built in $$(( $$(date +%s) - start ))s"
endef

## build: the eventpipe binary into $(BIN)/eventpipe (the README's commands run it
## by that path, so nothing needs installing or a PATH change).
build:
	$(call gobuild,$(BIN)/eventpipe,./cmd/eventpipe)

## run: the whole pipeline on this machine (testenv/cmd/demo): a control plane of
## its own (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, the Agent
## Sandbox controller and a hollow kubelet, built into $(BIN) on first use), a
## collector, the agent, the seed scenarios and the live diagnosis; Ctrl-C stops everything.
## It never touches another cluster (see README: the command for a real cluster).
## It builds $(BIN)/eventpipe too: the command the view says to try names it.
run: build
	$(call gobuild,$(BIN)/eventpipe-demo,./testenv/cmd/demo)
	$(BIN)/eventpipe-demo --cli $(BIN)/eventpipe $(ARGS)

## test: build every test server, then run all tests (what .ci/run calls).
## The steps run one after another: on 2 cores a cold run is CPU-bound, and
## running the builds side by side (make -j3) made it slower, not faster
## (bench/build.md). go test runs with -vet=off because `vet` has just run
## every vet check on the same packages (go test's own vet is a subset), and
## vet builds with the flags go test uses next (-race, $(TOOLGC)) so that the
## packages it compiles for its checks are the ones the tests link: a cold run
## compiles each package once, not once for vet and again for the tests.
test: tools chart-tools
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(MAKE) --no-print-directory vet
	$(GO) test $(GOTEST_FLAGS) $(TOOLGC) -vet=off ./...
	cd testenv/build && $(GO) test $(GOTEST_FLAGS) $(TOOLGC) -vet=off ./cri   # the hollow node's CRI (wrapper module)
	$(MAKE) --no-print-directory chart-check image-check

## vet: go vet on every module of the repository (and the slim agent build),
## each with the build flags its tests use (see test).
vet:
	$(GO) vet -race $(TOOLGC) ./...
	$(GO) vet -race $(TOOLGC) -tags agentonly ./cmd/eventpipe   # the slim agent build (and its tests) stays buildable
	cd testenv/build && $(GO) vet -race $(TOOLGC) ./cri
	cd deploy/check && $(GO) vet -race $(TOOLGC) ./...   # -race: it shares the main module's compiles (same versions)
	cd deploy/image && $(GO) vet $(TOOLGC) ./...

## tools: kube-apiserver, etcd, kubeparts (the hollow kubelet; testenv/build),
## victoria-logs and h2peer into $(BIN).
tools: kube-tools victoria-logs h2peer

kube-tools:
	$(ROOT)/testenv/build/build.sh "$(BIN)"

victoria-logs: $(BIN)/victoria-logs
$(BIN)/victoria-logs:
	mkdir -p $(BIN)
	GOBIN=$(BIN) GOFLAGS=-trimpath $(GO) install $(TOOLGC) github.com/VictoriaMetrics/VictoriaLogs/app/victoria-logs@$(VICTORIALOGS_VERSION)

## h2peer: the Rust gRPC peer (the h2 crate under tonic) of the driver proxy's
## interop test (testenv/h2peer, sinks/gateway/h2interop_test.go). No crates.io:
## it builds offline against the crates Debian packages (apt-installed when
## missing, like protoc in proto-tools). Cold: ~15 s apt + ~25 s cargo.
H2PEER_CRATES := librust-h2-dev librust-tokio-dev librust-bytes-dev librust-http-dev
# Cargo's target directory is a cache beside Go's, outside the clone: a fresh
# clone then compiles only h2peer itself (about 6 s), not tokio and h2 again
# (about 26 s). h2peer is cleaned first because cargo would take another
# clone's h2peer as fresh (its fingerprint names that clone's sources); the
# lock keeps two clones' clean, build and copy apart.
H2PEER_TARGET ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/eventpipe/h2peer-target
CARGO ?= $(shell command -v cargo || ls $(HOME)/.cargo/bin/cargo /root/.cargo/bin/cargo 2>/dev/null | head -1)
h2peer: $(BIN)/h2peer
$(BIN)/h2peer: $(ROOT)/testenv/h2peer/Cargo.toml $(ROOT)/testenv/h2peer/.cargo/config.toml $(wildcard $(ROOT)/testenv/h2peer/src/*.rs)
	dpkg -s $(H2PEER_CRATES) >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq $(H2PEER_CRATES); }
	mkdir -p $(H2PEER_TARGET)
	cargo=$(CARGO); [ -x "$$cargo" ] || { apt-get update -qq && apt-get install -y -qq cargo && cargo=/usr/bin/cargo; }; \
	cd $(ROOT)/testenv/h2peer && CARGO_TARGET_DIR=$(H2PEER_TARGET) flock $(H2PEER_TARGET)/.eventpipe.lock sh -c \
	  '"$$0" clean -p h2peer --release --quiet && "$$0" build --offline --release --quiet && cp "$$CARGO_TARGET_DIR/release/h2peer" "$$1"' "$$cargo" $@

## proto: regenerate api/eventpipe/v1/*.pb.go (committed).
proto: proto-tools
	PATH="$(BIN):$$PATH" $(ROOT)/api/gen.sh

proto-tools:
	command -v protoc >/dev/null || { apt-get update -qq && apt-get install -y -qq protobuf-compiler libprotobuf-dev; }
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

## dev-cluster: a control plane on loopback (etcd, kube-apiserver, kube-scheduler,
## kube-controller-manager) and a hollow node that runs the chart's collector as
## $(BIN)/eventpipe; prints a kubeconfig.
## It is built like make run's demo (gobuild: the release flags), not `go run`:
## so its compile of the client stack is the one the tests' eventpipe builds share.
dev-cluster: kube-tools build
	$(call gobuild,$(BIN)/eventpipe-dev-cluster,./testenv/cmd/dev-cluster)
	$(BIN)/eventpipe-dev-cluster $(ARGS)

## bench: run the Go benchmarks (see bench/README.md for the harnesses).
bench: tools
	$(GO) test -run '^$$' -bench . -benchmem ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)

## bench-agent / bench-collector: the end-to-end harnesses (see bench/*.md).
.PHONY: bench-agent bench-collector
bench-agent: tools
	$(GO) run ./bench/agent $(ARGS)

bench-collector:
	$(GO) run ./bench/collector $(ARGS)

## bench-kafka: the collector in Kafka mode on a 3-broker kfake (see bench/kafka.md).
.PHONY: bench-kafka
bench-kafka:
	$(GO) run ./bench/kafka $(ARGS)

## soak: the driver proxy's relay soak with a new random seed each run (grpc-go
## and the Rust h2 peer as the gateway), printed as "random seed N". `make test`
## runs only the fixed seeds; a seed that fails here is replayed with
## -soak.seed=N and kept as a fixed case (sinks/gateway/README.md, Soak).
## SOAK_FOR sets how long each run lasts.
.PHONY: soak
SOAK_FOR ?= 30s
soak: h2peer
	$(GO) test -race -count=1 -timeout 30m -run 'TestRelaySoak' ./sinks/gateway/ -soak.random -soak.for=$(SOAK_FOR) -v

## bench-gateway: the driver proxy harness (see bench/gateway.md).
.PHONY: bench-gateway
bench-gateway: tools
	$(GO) run ./bench/gateway $(ARGS)

## drills: the fault-drill suite, full form (10-minute sink outages, a subscriber
## 100,000 behind, ...; about 30 minutes), results into bench/drills.md. The short
## form runs in make test (bench/drills TestDrillsShort); drills-short runs it alone.
.PHONY: drills drills-short drills-planted
drills: tools
	$(GO) run ./bench/drills -full -out bench/drills.md $(ARGS)

## drills-planted: build the binary with each planted bug of bench/drills.md
## (build tags plant_*, never in a product build) and check that the drills
## named after it fail (bench/drills TestPlantedBugsFailTheirDrills; ~4 min).
drills-planted: tools
	EVENTPIPE_DRILLS_PLANTED=1 $(GO) test -count=1 -timeout 30m -run TestPlantedBugsFailTheirDrills -v ./bench/drills

drills-short: tools
	$(GO) run ./bench/drills -short -out bench/drills.md $(ARGS)

## ---- deployment: Helm chart, raw manifests, container image (deploy/) ----
HELM_VERSION := v3.22.0
KUBECONFORM_VERSION := v0.8.0
.PHONY: chart-tools chart-check manifests image image-check

## chart-tools: helm and kubeconform into $(BIN) (built from their modules).
chart-tools: $(BIN)/helm $(BIN)/kubeconform
$(BIN)/helm:
	mkdir -p $(BIN)
	GOBIN=$(BIN) GOFLAGS=-trimpath $(GO) install $(TOOLGC) helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
$(BIN)/kubeconform:
	mkdir -p $(BIN)
	GOBIN=$(BIN) GOFLAGS=-trimpath $(GO) install $(TOOLGC) github.com/yannh/kubeconform/cmd/kubeconform@$(KUBECONFORM_VERSION)

## chart-check: helm lint, kubeconform, server-side dry-run, values schema,
## generated manifests up to date, agent RBAC = its requests, alert and
## dashboard queries name exported metrics (deploy/check, its own module). It
## vets and tests with -race, as `make test` does the main module: the two
## modules resolve their shared dependencies to the same versions, so a cold
## run compiles the Kubernetes client stack once for both (bench/build.md).
chart-check: chart-tools kube-tools
	cd deploy/check && $(GO) vet -race $(TOOLGC) ./... && $(GO) test -race $(TOOLGC) -vet=off -count=1 -timeout 20m ./...

## manifests: render deploy/agent/*.yaml and deploy/collector/*.yaml from the chart.
manifests: $(BIN)/helm
	cd deploy/check && $(GO) run ./cmd/manifests

## image: build the container image without a daemon (deploy/image): an image
## tarball $(BIN)/eventpipe-image.tar (docker/podman load) and an OCI layout
## $(BIN)/eventpipe-oci for ARCH (default: this machine's); PUSH=registry/repo:tag
## pushes it.
ARCH ?= $(shell $(GO) env GOARCH)
image:
	rm -rf $(BIN)/eventpipe-oci
	cd deploy/image && $(GO) run . -arch $(ARCH) -out $(BIN)/eventpipe-image.tar -layout $(BIN)/eventpipe-oci $(if $(PUSH),-push $(PUSH))

## image-check: two builds give one digest; the image's user, entrypoint,
## labels and static binary are checked; a release (both architectures and
## the chart) is pushed to a registry on loopback and pulled back
## (deploy/image, its own module; helm from chart-tools).
image-check: $(BIN)/helm
	cd deploy/image && $(GO) vet $(TOOLGC) ./... && HELM=$(BIN)/helm $(GO) test $(TOOLGC) -count=1 -timeout 30m ./...   # a cold linux/arm64 build takes minutes

## version: set VERSION (x.y.z) as the chart's version and appVersion and the
## kustomization's image tag, and re-render the raw manifests; then write its
## CHANGELOG.md section and commit (docs/release.md).
.PHONY: version release
version: $(BIN)/helm
	@[ -n "$(VERSION)" ] || { echo "make version VERSION=x.y.z"; exit 2; }
	cd deploy/image && $(GO) run . -set-version $(VERSION)
	$(MAKE) manifests

## release: push the linux/amd64 + linux/arm64 image index to
## $(REGISTRY)/eventpipe:$(VERSION) and the chart to oci://$(REGISTRY)/charts,
## after checking that the tree names VERSION everywhere (docs/release.md).
## Credentials: docker login (image) and helm registry login (chart).
REGISTRY ?= ghcr.io/eventpipe
release: $(BIN)/helm
	@[ -n "$(VERSION)" ] || { echo "make release VERSION=x.y.z [REGISTRY=$(REGISTRY)]"; exit 2; }
	cd deploy/image && HELM_REGISTRY_CONFIG=$${HELM_REGISTRY_CONFIG:-$$HOME/.config/helm/registry/config.json} \
	  $(GO) run . -release -version $(VERSION) -repo $(REGISTRY)/eventpipe -chart-dest oci://$(REGISTRY)/charts -helm $(BIN)/helm
