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


def test_suffix_arms_and_tree_settings_reach_the_worker_config_and_need_the_nightjar_policy():
    from nightjar_contract.runtime import WorkerRuntimeConfig
    from nightjar_operator.reconcile.config import engine_hash, render_runtime_config, runtime_config_dict
    from nightjar_operator.reconcile.validate import planner_config_errors

    spec = _spec(ngram=True, suffix={"enabled": True, "cacheRequests": 200, "treeDepth": 16}, maxGamma=3, arms=[0, 2, 3])
    assert semantic_errors(spec, "demo") == [] and planner_config_errors(spec) == []
    cfg = WorkerRuntimeConfig.model_validate(runtime_config_dict(spec))
    assert cfg.planner.ngram_arms == [2, 3] and cfg.planner.suffix_arms == [2, 3]
    assert cfg.planner.host_arms() == {"ngram": (2, 3), "suffix": (2, 3)}
    # the settings given, the worker's defaults for the rest
    assert (cfg.suffix.cache_requests, cfg.suffix.tree_depth) == (200, 16)
    assert cfg.suffix.min_token_prob == WorkerRuntimeConfig().suffix.min_token_prob
    assert "suffix_arms" in render_runtime_config(spec)
    # none set: no suffix block, the worker's defaults; settings alone (cacheRequests 0: no cross-request
    # cache) are written without arms
    assert "suffix" not in runtime_config_dict(_spec())
    alone = runtime_config_dict(_spec(suffix={"cacheRequests": 0}))
    assert alone["suffix"] == {"cache_requests": 0} and "suffix_arms" not in alone["planner"]
    # the trees are built at start-up: a change of their settings rolls the pods, enabling the arms does not
    assert engine_hash(_spec(suffix={"enabled": True})) == engine_hash(_spec())
    assert engine_hash(_spec(suffix={"treeDepth": 8})) != engine_hash(_spec())
    errs = semantic_errors(_spec(suffix={"enabled": True}, policy="static"), "demo")
    assert [e.field for e in errs] == ["spec.speculation.suffix.enabled"]


def test_bad_suffix_settings_name_their_field():
    for bad, field in (({"cacheRequests": -1}, "spec.speculation.suffix.cacheRequests"),
                       ({"treeDepth": 0}, "spec.speculation.suffix.treeDepth"),
                       ({"minTokenProb": 1.5}, "spec.speculation.suffix.minTokenProb"),
                       ({"enabled": True, "size": 3}, "spec.speculation.suffix.size")):
        spec, errs = parse_spec({**SPEC, "speculation": {"suffix": bad}})
        assert spec is None and [e.field for e in errs] == [field], (bad, errs)
