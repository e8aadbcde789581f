"""The operator <-> worker contract: what the operator writes and the worker reads, defined once.

Pure pydantic (no torch, no vLLM, no Kubernetes client), imported by both sides:
  * ``planner``: ``PlannerConfig`` and ``PlannerPriors`` (the fleet's priors);
  * ``runtime``: ``WorkerRuntimeConfig`` (ConfigMap key ``nightjar.yaml``), the planner fields a
    running worker cannot take (``RESTART_FIELDS``: the operator rolls the pods) and those that
    rebuild the policy (``REBUILD_FIELDS``);
  * ``memory``: ``ElasticMemoryConfig`` (env ``NIGHTJAR_MEMORY``).

``__version__`` is the project's one version: the distribution, the images' default tags and the
CRD's default worker image read it.
"""

__version__ = "0.1.0"
