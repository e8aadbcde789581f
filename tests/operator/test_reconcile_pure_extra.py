"""Operator -> worker contract: the env the pods get is what the worker's own models accept."""

import json

from nightjar_contract.memory import ElasticMemoryConfig
from nightjar_operator.reconcile.children import _memory_env
from nightjar_operator.reconcile.validate import parse_spec, semantic_errors

SPEC = {
    "target": {"name": "t", "source": {"imagePath": "/models/t"}},
    "draft": {"name": "d", "source": {"imagePath": "/models/d"}},
    "image": "example.org/nightjar-worker:1",
}


def _spec(**speculation):
    spec, errs = parse_spec({**SPEC, "speculation": speculation})
    assert not errs, errs
    return spec


def test_memory_env_is_a_valid_worker_memory_config():
    cfg = ElasticMemoryConfig.model_validate(json.loads(_memory_env(_spec(offload={"policy": "Auto", "kvUsageHigh": 0.8}))))
    assert cfg.enabled and cfg.policy.kv_usage_high == 0.8
    assert not ElasticMemoryConfig.model_validate(json.loads(_memory_env(_spec(offload={"policy": "Never"})))).enabled
    assert cfg.policy.recheck_after_s == 30.0  # the worker's default
    for given, worker in ((90, 90.0), (0, None)):  # 0: only when the planner asks
        env = json.loads(_memory_env(_spec(offload={"recheckAfterSeconds": given})))
        assert ElasticMemoryConfig.model_validate(env).policy.recheck_after_s == worker
    assert not cfg.allow_unverified_cuda  # GPU pods keep the draft resident until a GPU check passed
    env = json.loads(_memory_env(_spec(offload={"allowUnverifiedCuda": True})))
    assert ElasticMemoryConfig.model_validate(env).allow_unverified_cuda


def test_ngram_arms_reach_the_worker_config_and_need_the_nightjar_policy():
    from nightjar_contract.runtime import WorkerRuntimeConfig
    from nightjar_operator.reconcile.config import runtime_config_dict

    spec = _spec(ngram=True, maxGamma=3, arms=[0, 2, 3])
    assert semantic_errors(spec, "demo") == []
    cfg = WorkerRuntimeConfig.model_validate(runtime_config_dict(spec))
    assert cfg.planner.ngram_arms == [2, 3]
    errs = semantic_errors(_spec(ngram=True, policy="static"), "demo")
    assert [e.field for e in errs] == ["spec.speculation.ngram"]
