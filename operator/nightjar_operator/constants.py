"""Names fixed once for the whole project (API group, labels, child names, paths in the pod)."""

from __future__ import annotations

GROUP = "nightjar.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "NightjarDeployment"
PLURAL = "nightjardeployments"
SINGULAR = "nightjardeployment"
SHORT_NAMES = ["njd"]
CRD_NAME = f"{PLURAL}.{GROUP}"

OPERATOR_NAME = "nightjar-operator"
# fieldManager of every write to a child: with our labels, how an orphaned child is recognised.
FIELD_MANAGER = OPERATOR_NAME

# Labels on every child object and on the worker pods.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_DEPLOYMENT = f"{GROUP}/deployment"  # name of the owning NightjarDeployment
# The Deployment selector includes the track so a rollout can run a second (candidate) Deployment
# behind the same Service without overlapping selectors (Deployment selectors are immutable).
LABEL_TRACK = f"{GROUP}/track"
WORKER_APP = "nightjar-worker"
TRACK_STABLE = "stable"
TRACK_CANDIDATE = "candidate"

# Annotations the operator writes.
ANN_DESIRED_HASH = f"{GROUP}/desired-hash"  # hash of what the operator last wrote into a child
ANN_ENGINE_HASH = f"{GROUP}/engine-config-hash"  # pod template: restart-only planner fields
ANN_TARGET = f"{GROUP}/target"
ANN_DRAFT = f"{GROUP}/draft"

# Worker pod layout.
HTTP_PORT = 8000
CONFIG_KEY = "nightjar.yaml"
CONFIG_DIR = "/etc/nightjar"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
MODELS_DIR = "/models"
CACHE_DIR = "/var/cache/nightjar"
WORKER_UID = 1000
GPU_RESOURCE = "nvidia.com/gpu"

# Condition types.
COND_READY = "Ready"
COND_PROGRESSING = "Progressing"
COND_DEGRADED = "Degraded"
COND_SLO_MET = "SLOMet"
COND_ELASTIC_MEMORY = "ElasticMemory"
COND_AUTOSCALING = "Autoscaling"
COND_ROUTING = "Routing"
CONDITION_TYPES = (COND_READY, COND_PROGRESSING, COND_DEGRADED, COND_SLO_MET, COND_ELASTIC_MEMORY, COND_AUTOSCALING,
                   COND_ROUTING)


def config_map_name(name: str) -> str:
    return f"{name}-config"


def pdb_name(name: str) -> str:
    return name


def deployment_name(name: str) -> str:
    return name


def service_name(name: str) -> str:
    return name


def candidate_name(name: str) -> str:
    """The rollout's candidate revision: its Deployment (and, with spec.routing, its pool or Service)."""
    return f"{name}-candidate"


def candidate_config_name(name: str) -> str:
    return f"{name}-candidate-config"
