# Container images and the real test node (owner: images / cluster harness). See docs/install.md.
# `make images` builds with buildah, podman or docker; on a machine that reaches no registry the
# bases are bootstrapped from Debian's packages (scripts/images/bootstrap-base.sh). Layers are cached.
IMAGES ?= operator worker-cpu models pause
# Registry prefix of every image name (the chart's and the samples' default); `make images
# REGISTRY=registry.example.com/nightjar push` builds under your registry's names and pushes there.
REGISTRY ?= ghcr.io/nightjar-dev
VERSION ?= $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' contract/nightjar_contract/__init__.py)

.PHONY: runtime images push images-constraints e2e kind-load

runtime: ## containerd, runc, CNI plugins, podman/buildah, debootstrap from Debian (root; idempotent)
	bash scripts/k8s/install-runtime.sh

images: runtime models ## build the images ($(IMAGES)); IMAGES=worker-cuda for the CUDA worker (not built here)
	VERSION=$(VERSION) REGISTRY=$(REGISTRY) MODELS_DIR=$(MODELS_DIR) bash scripts/images/build.sh $(IMAGES)

# Pushes what `make images` built ($(IMAGES) but the local pause image); log in to the registry first.
push: ## push the built images to $(REGISTRY): make images REGISTRY=registry.example.com/nightjar push
	VERSION=$(VERSION) REGISTRY=$(REGISTRY) bash scripts/images/push.sh $(filter-out pause,$(IMAGES))

images-constraints: install ## pin the images' Python packages to the versions the tests run with
	{ sed -n '1,2p' images/constraints.txt; $(PIP) list --format=freeze --exclude-editable | grep -v -E '^(torchvision|torchaudio|torchcodec|triton)=='; } > images/constraints.txt.new
	mv images/constraints.txt.new images/constraints.txt

# The user's journey on the real node: helm install -> NightjarDeployment -> chat completion ->
# Prometheus -> fleet priors -> failure drills -> helm uninstall (tests/e2e).
e2e: install cluster-build helm prometheus images ## the end-to-end test on a real kubelet (root)
	$(VENV)/bin/pytest -q tests/e2e

# For users with Docker and kind: load the locally built images into a kind cluster (not run here).
kind-load: ## load the built images into the kind cluster $(KIND_CLUSTER)
	bash scripts/images/kind-load.sh $(KIND_CLUSTER)

TEST_DEPS += runtime images
