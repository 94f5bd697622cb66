# Build targets. `make deb` builds dist/gpuagent_<version>_<arch>.deb (the node agent) and
# dist/gpuagent-aggregator_<version>_<arch>.deb (the fleet aggregator) for this machine's
# Debian release and Python (see docs/packaging.md); `make deb VERSION=0.1.0+1` builds
# another package version from the same tree. `make deb-chroot SUITE=trixie` builds them in
# a fresh chroot of another Debian release, into dist/<suite>/.
# `make image` builds the container image localhost/gpuagent:<version> from Debian packages
# (no registry base image; see docs/kubernetes.md); `make image IMAGE=registry/gpuagent:tag`
# names it otherwise, `make image ARCH=arm64` builds it for arm64 (GB200 nodes).

VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
ARCH := $(shell dpkg --print-architecture 2>/dev/null || echo amd64)
DEB_TREE := build/deb/gpuagent-$(VERSION)
DEBS := $(foreach package,gpuagent gpuagent-aggregator,$(package)_$(VERSION)_$(ARCH).deb)
# What the packages are built from: the agent and the files they install.
DEB_SOURCES := agent pyproject.toml README.md config.example.toml docs deploy systemd
# deb/control's Build-Depends, and lintian.
DEB_BUILD_DEPS := debhelper dpkg-dev fakeroot lintian libpq-dev libsystemd-dev pkg-config \
	python3 python3-dev python3-venv
SUITE ?= trixie
MIRROR ?= http://deb.debian.org/debian
comma := ,
empty :=
space := $(empty) $(empty)

IMAGE ?= localhost/gpuagent:$(VERSION)

.PHONY: deb deb-deps deb-build deb-chroot deb-clean image image-deps

deb-deps:
	scripts/setup $(DEB_BUILD_DEPS)

deb: deb-deps
	$(MAKE) deb-build

# The build itself, with the build dependencies installed (deb-deps, or deb-chroot's chroot).
deb-build:
	rm -rf $(DEB_TREE) && mkdir -p $(DEB_TREE) dist
	tar -c --exclude=__pycache__ --exclude='*.egg-info' $(DEB_SOURCES) | tar -x -C $(DEB_TREE)
	cp -r deb $(DEB_TREE)/debian
	cp systemd/gpuagent.service systemd/gpuagent-aggregator.service $(DEB_TREE)/debian/
	@# A version other than the changelog's gets its own changelog entry on top.
	if [ "$$(dpkg-parsechangelog -l deb/changelog -S Version)" != "$(VERSION)" ]; then \
		{ printf 'gpuagent (%s) unstable; urgency=medium\n\n  * Build of %s.\n\n -- %s  %s\n\n' \
			"$(VERSION)" "$(VERSION)" "gpuagent maintainers <gpuagent@example.org>" \
			"$$(date -R)"; cat deb/changelog; } > $(DEB_TREE)/debian/changelog; \
	fi
	cd $(DEB_TREE) && dpkg-buildpackage -b -us -uc -j$$(nproc)
	cd build/deb && mv $(DEBS) ../../dist/
	cd dist && lintian --fail-on error --info $(DEBS)
	@cd dist && ls -l $(DEBS)

# The same build in a chroot of Debian $(SUITE) made for it (mmdebstrap, from $(MIRROR)) and
# deleted afterwards: the packages for that release's Python, into dist/$(SUITE)/. The
# chroot trusts the certificate authorities added to this machine
# (/usr/local/share/ca-certificates), as pip here does, so a proxy to PyPI that this machine
# trusts works there too.
deb-chroot:
	scripts/setup mmdebstrap
	rm -rf build/chroot && mkdir -p build/chroot dist/$(SUITE)
	tar -c --exclude=__pycache__ --exclude='*.egg-info' Makefile deb $(DEB_SOURCES) \
		> build/chroot/src.tar
	mmdebstrap --quiet --mode=root --variant=buildd \
		--include=$(subst $(space),$(comma),$(strip $(DEB_BUILD_DEPS) ca-certificates)) \
		--customize-hook='if [ -d /usr/local/share/ca-certificates ]; then \
			cp -r /usr/local/share/ca-certificates/. "$$1/usr/local/share/ca-certificates/" && \
			chroot "$$1" update-ca-certificates >/dev/null; fi' \
		--customize-hook='mkdir "$$1/src"' --customize-hook='tar-in build/chroot/src.tar /src' \
		--customize-hook='chroot "$$1" make -C /src deb-build VERSION=$(VERSION)' \
		--customize-hook='copy-out $(addprefix /src/dist/,$(DEBS)) dist/$(SUITE)' \
		$(SUITE) /dev/null $(MIRROR)
	rm -rf build/chroot
	@cd dist/$(SUITE) && ls -l $(DEBS)

deb-clean:
	rm -rf build/deb build/chroot dist/gpuagent_*.deb dist/gpuagent-aggregator_*.deb dist/*/gpuagent*.deb

image-deps:
	scripts/setup mmdebstrap podman

image: image-deps
	GPUAGENT_IMAGE_ARCH=$(ARCH) scripts/build-image $(IMAGE)
