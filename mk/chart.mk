# Helm chart, plain manifests, Grafana dashboards, Prometheus rules (owner: chart area).
# See docs/install.md and docs/dashboard.md.
CHART := charts/nightjar
CHART_CRDS := $(CHART)/files/crds
MANIFESTS_DIR ?= manifests
MANIFESTS_NS ?= nightjar-system
HELM_RENDER = $(HELM) template nightjar $(CHART) --namespace $(MANIFESTS_NS) --skip-tests --set crds.install=false

.PHONY: prometheus chart-crds dashboards chart-readme manifests manifests-render chart-lint

prometheus: ## Prometheus + promtool from Debian (idempotent; tests start their own on loopback)
	bash scripts/prometheus/install.sh

# The chart reads the CRD through symlinks to `make crds`'s output: one source, no copy to drift
# (helm follows them, and `helm package` stores the contents).
chart-crds: ## link manifests/crds/*.yaml into the chart (files/crds/)
	mkdir -p $(CHART_CRDS)
	rm -f $(CHART_CRDS)/*.yaml
	for f in manifests/crds/*.yaml; do ln -s ../../../../$$f $(CHART_CRDS)/$$(basename $$f); done

dashboards: ## regenerate charts/nightjar/dashboards/*.json from scripts/prometheus/dashboard.py
	python3 scripts/prometheus/dashboard.py

chart-readme: ## regenerate charts/nightjar/README.md from values.yaml's comments
	python3 scripts/chart/readme.py

manifests: crds chart-crds dashboards chart-readme manifests-render ## render manifests/ (plain YAML) from the chart

# Render only (no regeneration): the test renders into a temporary MANIFESTS_DIR and compares.
manifests-render:
	mkdir -p $(MANIFESTS_DIR)/rbac $(MANIFESTS_DIR)/monitoring
	printf '# Rendered by `make manifests` (do not edit).\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n' $(MANIFESTS_NS) > $(MANIFESTS_DIR)/namespace.yaml
	$(HELM_RENDER) -s templates/serviceaccount.yaml | sed '1i # Rendered from charts/nightjar by `make manifests` (do not edit).' > $(MANIFESTS_DIR)/rbac/service_account.yaml
	$(HELM_RENDER) -s templates/clusterrole.yaml | sed '1i # Rendered from charts/nightjar by `make manifests` (do not edit).' > $(MANIFESTS_DIR)/rbac/cluster_role.yaml
	$(HELM_RENDER) -s templates/clusterrolebinding.yaml | sed '1i # Rendered from charts/nightjar by `make manifests` (do not edit).' > $(MANIFESTS_DIR)/rbac/cluster_role_binding.yaml
	$(HELM_RENDER) -s templates/leader-election.yaml | sed '1i # Rendered from charts/nightjar by `make manifests` (do not edit).' > $(MANIFESTS_DIR)/rbac/leader_election.yaml
	$(HELM_RENDER) -s templates/aggregated-roles.yaml | sed '1i # Rendered from charts/nightjar by `make manifests` (do not edit). Aggregated into the built-in view/edit/admin roles.' > $(MANIFESTS_DIR)/rbac/aggregated_roles.yaml
	$(HELM_RENDER) -s templates/deployment.yaml -s templates/service.yaml -s templates/webhook.yaml | sed '1i # Rendered from charts/nightjar by `make manifests` (do not edit).' > $(MANIFESTS_DIR)/operator.yaml
	$(HELM_RENDER) -s templates/dashboards.yaml | sed '1i # Rendered from charts/nightjar by `make manifests` (do not edit). Grafana dashboards for the sidecar.' > $(MANIFESTS_DIR)/monitoring/grafana-dashboards.yaml
	$(HELM_RENDER) --api-versions monitoring.coreos.com/v1 -s templates/servicemonitor.yaml -s templates/podmonitor.yaml -s templates/prometheusrule.yaml | sed '1i # Rendered from charts/nightjar by `make manifests` (do not edit). Needs the Prometheus Operator CRDs.' > $(MANIFESTS_DIR)/monitoring/prometheus-operator.yaml

chart-lint: ## helm lint, promtool check rules, dashboards and CRD copy up to date
	$(HELM) lint --strict $(CHART)
	promtool check rules $(CHART)/rules/*.yaml
	python3 scripts/prometheus/dashboard.py --check
	diff -r manifests/crds $(CHART_CRDS)

TEST_DEPS += prometheus
