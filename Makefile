# Build targets. `make deb` builds dist/gpuagent_<version>_<arch>.deb (see docs/packaging.md);
# `make deb VERSION=0.1.0+1` builds another package version from the same tree.
# `make image` builds the container image localhost/gpuagent:<version> from Debian packages
# (no registry base image; see docs/kubernetes.md); `make image IMAGE=registry/gpuagent:tag`
# names it otherwise, `make image ARCH=arm64` builds it for arm64 (GB200 nodes).

VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB_TREE := build/deb/gpuagent-$(VERSION)
DEB := dist/gpuagent_$(VERSION)_$(ARCH).deb
# What the package is built from: the agent and the files it installs.
DEB_SOURCES := agent pyproject.toml README.md config.example.toml docs deploy systemd

IMAGE ?= localhost/gpuagent:$(VERSION)

.PHONY: deb deb-deps deb-clean image image-deps

deb-deps:
	scripts/setup debhelper dpkg-dev fakeroot lintian libpq-dev libsystemd-dev pkg-config \
		python3.11 python3.11-dev python3.11-venv

deb: deb-deps
	rm -rf $(DEB_TREE) && mkdir -p $(DEB_TREE) dist
	tar -c --exclude=__pycache__ --exclude='*.egg-info' $(DEB_SOURCES) | tar -x -C $(DEB_TREE)
	cp -r deb $(DEB_TREE)/debian
	cp systemd/gpuagent.service $(DEB_TREE)/debian/gpuagent.service
	cp systemd/gpuagent-aggregator.service $(DEB_TREE)/debian/gpuagent.gpuagent-aggregator.service
	@# A version other than the changelog's gets its own changelog entry on top.
	if [ "$$(dpkg-parsechangelog -l deb/changelog -S Version)" != "$(VERSION)" ]; then \
		{ printf 'gpuagent (%s) unstable; urgency=medium\n\n  * Build of %s.\n\n -- %s  %s\n\n' \
			"$(VERSION)" "$(VERSION)" "gpuagent maintainers <gpuagent@example.org>" \
			"$$(date -R)"; cat deb/changelog; } > $(DEB_TREE)/debian/changelog; \
	fi
	cd $(DEB_TREE) && dpkg-buildpackage -b -us -uc -j$$(nproc)
	mv build/deb/gpuagent_$(VERSION)_$(ARCH).deb $(DEB)
	lintian --fail-on error --info $(DEB)
	@ls -l $(DEB)

deb-clean:
	rm -rf build/deb dist/gpuagent_*.deb

image-deps:
	scripts/setup mmdebstrap podman

image: image-deps
	GPUAGENT_IMAGE_ARCH=$(ARCH) scripts/build-image $(IMAGE)
