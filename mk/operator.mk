# Operator (owner: operator area). See docs/operator.md.
CRD_FILE := manifests/crds/nightjar.dev_nightjardeployments.yaml

.PHONY: crds operator-run

crds: install ## regenerate the NightjarDeployment CRD from the pydantic models
	$(VENV)/bin/nightjar-operator crd -o $(CRD_FILE)

operator-run: install ## run the operator locally against $$KUBECONFIG (all namespaces)
	$(VENV)/bin/nightjar-operator run --metrics-port 8080
