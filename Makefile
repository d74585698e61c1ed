# forkd — see README.md. Two commands do everything on a fresh Debian host:
#   make quickstart   install, build, snapshot py-pandas, fork 3, run pandas
#   make test         unit tests + integration tests that boot real microVMs

GO        ?= go
# scripts/install-go.sh puts Go there when the host's is missing or too old.
export PATH := /usr/local/go/bin:$(PATH)
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
# Integration tests share an image cache across runs (kernel, busybox, root fs).
export FORKD_TEST_DATA_DIR ?= /var/tmp/forkd-test
# As root (CI; test-deps installed everything), a missing prerequisite of a
# privileged test (root, busybox, the guest kernel) fails it instead of
# skipping it, so a VM test can never pass by not running.
export FORKD_TEST_PRIVILEGED ?= $(shell [ "$$(id -u)" = 0 ] && echo 1)

.PHONY: all build deps test-deps quickstart test test-load unit integration vet fmt bench clean

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/forkd ./cmd/forkd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o bin/forkd-agent ./cmd/forkd-agent

deps:
	./scripts/install-deps.sh

test-deps:
	./scripts/install-deps.sh --test

quickstart: deps build
	./scripts/quickstart.sh

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

# Unit tests (race detector on). Packages that need root or QEMU skip
# themselves unless run as root with the tools present; `make test` runs as root.
unit:
	$(GO) test -race -count=1 ./internal/... ./cmd/...

# Integration tests boot real microVMs (minimal busybox image) through the
# engine, the daemon API and the CLI.
integration: build
	$(GO) test -count=1 -timeout 40m ./integration/...

test: test-deps build vet unit integration

# The whole suite while every core is kept busy (scripts/test-load.sh), as
# CI may be: a test that waits for a fixed time instead of a condition
# fails here first.
test-load:
	./scripts/test-load.sh

bench: build
	sudo ./bin/forkd bench spawn

clean:
	rm -rf bin
