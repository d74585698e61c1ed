# forkd — see README.md. Two commands do everything on a fresh Debian host:
#   make quickstart   install, build, snapshot py-pandas, fork 3, run pandas
#   make test         unit tests, integration tests that boot real microVMs,
#                     and the Kubernetes tests against a real kube-apiserver

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
# Likewise a Kubernetes test that cannot get its control plane (a private
# network namespace needs root or user namespaces) fails instead of skipping.
export FORKD_K8S_REQUIRED ?= $(shell [ "$$(id -u)" = 0 ] && echo 1)
# The Go modules for Kubernetes, kept out of the root go.mod so the daemon
# never links client-go or controller-runtime (docs/KUBERNETES.md).
K8S_MODULES := k8s test/k8s

# Install layout (make install, the .deb, the release tarball): forkd finds
# forkd-agent in PREFIX/lib/forkd and recipes in PREFIX/share/forkd from its
# own path, so any PREFIX works without flags.
PREFIX    ?= /usr
DESTDIR   ?=
SYSCONFDIR ?= /etc
UNITDIR   ?= $(if $(filter /usr,$(PREFIX)),/lib/systemd/system,$(PREFIX)/lib/systemd/system)
# A Debian version for git builds: the tag without its v when HEAD has one
# (v1.2.0-3-gabc -> 1.2.0+3.gabc), else 0.0.0~gitDATE.SHA (sorts before 0.0.0).
DEB_VERSION ?= $(shell v=$$(git describe --tags --match 'v[0-9]*' 2>/dev/null) && echo "$${v\#v}" | sed 's/-\([0-9]*\)-g/+\1.g/' || \
	echo "0.0.0~git$$(git log -1 --format=%cd --date=format:%Y%m%d%H%M%S 2>/dev/null || echo 0).$$(git rev-parse --short HEAD 2>/dev/null || echo dev)")
# nfpm builds the .deb; `go run` fetches it through the Go module proxy on
# first use, so a fresh clone needs nothing else installed.
NFPM      ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
DIST_NAME := forkd-$(DEB_VERSION)-linux-amd64

.PHONY: all build deps test-deps quickstart test test-k8s-norace test-k8s test-load unit integration vet fmt bench clean install uninstall deb dist images push-images

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
	$(GO) test -count=1 -timeout 55m ./integration/...

# Kubernetes tests: the modules in K8S_MODULES, vetted and run; test/k8s
# starts a real etcd and kube-apiserver, which scripts/k8s-testenv.sh
# builds from the Go module proxy once and caches in ~/.cache/forkd/k8s;
# test/k8s/e2e runs bin/forkd as the nodes' daemons, hence build. All with
# -trimpath, as the script builds kube-apiserver, so the tests reuse what
# that build compiled (client-go, apimachinery). make test runs them
# without the race detector (cold on 2 cores: about 16 minutes, binaries
# included; warm: about a minute); make test-k8s adds it (about 6 more
# minutes cold, compiling those libraries again with -race).
define k8s_tests
	@for m in $(K8S_MODULES); do (cd $$m && echo "go vet ($$m)" && GOFLAGS=-trimpath $(GO) vet ./...) || exit 1; done
	assets=$$(./scripts/k8s-testenv.sh) && for m in $(K8S_MODULES); do \
		(cd $$m && KUBEBUILDER_ASSETS=$$assets GOFLAGS=-trimpath $(GO) test $(1) -count=1 -timeout 30m ./...) || exit 1; done
endef

test-k8s-norace: build
	$(call k8s_tests,)

test-k8s: build
	$(call k8s_tests,-race)

test: test-deps build vet unit integration test-k8s-norace

# The whole suite while every core is kept busy (scripts/test-load.sh), as
# CI may be: a test that waits for a fixed time instead of a condition
# fails here first.
test-load:
	./scripts/test-load.sh

bench: build
	sudo ./bin/forkd bench spawn

clean:
	rm -rf bin dist

# install: binaries, recipes, docs, the systemd unit (its paths rewritten
# for PREFIX) and the config, which is never overwritten.
install: build
	install -D -m 0755 bin/forkd $(DESTDIR)$(PREFIX)/bin/forkd
	install -D -m 0755 bin/forkd-agent $(DESTDIR)$(PREFIX)/lib/forkd/forkd-agent
	cd recipes && find . -type f | while read -r f; do \
		install -D -m 0644 "$$f" "$(DESTDIR)$(PREFIX)/share/forkd/recipes/$$f" || exit 1; done
	install -D -m 0644 -t $(DESTDIR)$(PREFIX)/share/doc/forkd README.md docs/*.md
	install -d $(DESTDIR)$(UNITDIR)
	sed -e 's|/usr/bin/forkd|$(PREFIX)/bin/forkd|g' -e 's|/usr/share/doc/forkd|$(PREFIX)/share/doc/forkd|g' \
		-e 's|/usr/lib/forkd|$(PREFIX)/lib/forkd|g' -e 's|/etc/forkd|$(SYSCONFDIR)/forkd|g' \
		packaging/forkd.service >$(DESTDIR)$(UNITDIR)/forkd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/forkd.service
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/forkd/forkd.toml ]; then \
		echo "keeping $(DESTDIR)$(SYSCONFDIR)/forkd/forkd.toml (the new default is packaging/forkd.toml)"; \
	else install -D -m 0644 packaging/forkd.toml $(DESTDIR)$(SYSCONFDIR)/forkd/forkd.toml; fi

# uninstall removes what install put there except the config and the data
# (/var/lib/forkd): remove those by hand to forget everything.
uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/forkd $(DESTDIR)$(UNITDIR)/forkd.service
	rm -rf $(DESTDIR)$(PREFIX)/lib/forkd $(DESTDIR)$(PREFIX)/share/forkd $(DESTDIR)$(PREFIX)/share/doc/forkd
	@echo "kept $(DESTDIR)$(SYSCONFDIR)/forkd and /var/lib/forkd"

# deb: dist/forkd_VERSION_amd64.deb (packaging/nfpm.yaml).
deb: build
	mkdir -p dist
	DEB_VERSION='$(DEB_VERSION)' $(NFPM) package --config packaging/nfpm.yaml --packager deb \
		--target dist/forkd_$(DEB_VERSION)_amd64.deb

# images: the node daemon's and the controller's container images as
# docker-archive tarballs in dist/images/ (packaging/images.sh: no
# container runtime; needs root and the Debian mirror). REGISTRY and
# IMAGE_TAG name them (default ghcr.io/forkd-dev, the version).
images: build deb
	VERSION='$(VERSION)' DEB_VERSION='$(DEB_VERSION)' GO='$(GO)' ./packaging/images.sh

# push-images: the two images of make images to REGISTRY (docker login
# first), printing REF@DIGEST of each (packaging/push-images.sh).
push-images:
	VERSION='$(VERSION)' GO='$(GO)' ./packaging/push-images.sh

# dist: a release tarball laid out as `make install` lays out / (extract it
# with tar -C /, or anywhere and run usr/bin/forkd), and SHA256SUMS.
dist: build deb
	rm -rf dist/stage && mkdir -p dist/stage
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/dist/stage PREFIX=/usr
	tar -C dist/stage --owner=0 --group=0 --numeric-owner --sort=name -czf dist/$(DIST_NAME).tar.gz .
	rm -rf dist/stage
	cd dist && sha256sum $(DIST_NAME).tar.gz forkd_$(DEB_VERSION)_amd64.deb >SHA256SUMS
