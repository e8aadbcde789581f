"""Fleet aggregation from per-pod scrapes."""

from __future__ import annotations

import math

import pytest
from nightjar_operator.fleet.aggregate import aggregate, extract, window
from nightjar_operator.fleet.promtext import parse


def pod_doc(loss_b1_g2=0.01, count_b1_g2=10, drafted=100, accepted=60, ttft=(5, 9, 10), gen=1000, state="resident",
            running=2, waiting=1, draft_prefill=0.006):
    b1, b2, inf = ttft
    return f"""
nightjar_planner_draft_prefill_per_prompt_token_seconds {draft_prefill}
nightjar_planner_loss_seconds{{bucket="1",gamma="2",source="draft"}} {loss_b1_g2}
nightjar_planner_count{{bucket="1",gamma="2",source="draft"}} {count_b1_g2}
nightjar_planner_loss_seconds{{bucket="1",gamma="2",source="ngram"}} 0.007
nightjar_planner_count{{bucket="1",gamma="2",source="ngram"}} 6
nightjar_planner_loss_seconds{{bucket="8",gamma="0"}} 0.02
nightjar_planner_count{{bucket="8",gamma="0"}} 4
nightjar_planner_loss_seconds{{bucket="8",gamma="3",source="draft"}} 0.05
nightjar_planner_count{{bucket="8",gamma="3",source="draft"}} 0
nightjar_draft_tokens_total{{gamma="2"}} {drafted}
nightjar_accepted_tokens_total{{gamma="2"}} {accepted}
nightjar_acceptance_rate{{gamma="4"}} 0.5
nightjar_switch_cost_seconds_bucket{{le="0.01"}} 1
nightjar_switch_cost_seconds_bucket{{le="0.1"}} 2
nightjar_switch_cost_seconds_bucket{{le="+Inf"}} 2
nightjar_switch_cost_seconds_sum 0.06
nightjar_switch_cost_seconds_count 2
vllm:time_to_first_token_seconds_bucket{{le="0.1",model_name="m"}} {b1}
vllm:time_to_first_token_seconds_bucket{{le="0.5",model_name="m"}} {b2}
vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {inf}
vllm:time_to_first_token_seconds_sum{{model_name="m"}} 1.0
vllm:time_to_first_token_seconds_count{{model_name="m"}} {inf}
vllm:inter_token_latency_seconds_bucket{{le="0.02"}} 50
vllm:inter_token_latency_seconds_bucket{{le="0.05"}} 100
vllm:inter_token_latency_seconds_bucket{{le="+Inf"}} 100
vllm:generation_tokens_total{{model_name="m"}} {gen}
vllm:num_requests_running{{model_name="m"}} {running}
vllm:num_requests_waiting{{model_name="m"}} {waiting}
nightjar_draft_state_info{{state="resident"}} {1 if state == "resident" else 0}
nightjar_draft_state_info{{state="offloaded"}} {1 if state == "offloaded" else 0}
"""


def test_extract_reads_every_family():
    pm = extract(parse(pod_doc()), ts=100.0)
    # per source (a series without the label, from a worker before it, is the draft model's);
    # zero-count entry dropped
    assert pm.planner == {(1, 2, "draft"): (0.01, 10.0), (1, 2, "ngram"): (0.007, 6.0), (8, 0, "draft"): (0.02, 4.0)}
    assert pm.draft_tokens == {2: 100.0} and pm.accepted_tokens == {2: 60.0}
    assert pm.acceptance_gauge == {4: 0.5}
    assert pm.switch_cost is not None and pm.switch_cost.count == 2
    assert pm.ttft is not None and pm.ttft.observations == 10
    assert pm.tpot is not None and pm.tpot.observations == 100  # fallback name
    assert pm.generation_tokens == 1000 and pm.running == 2 and pm.waiting == 1
    assert pm.draft_state == "resident"
    assert pm.draft_prefill_s == 0.006
    assert extract(parse(pod_doc(draft_prefill=0)), ts=100.0).draft_prefill_s is None  # 0: not known yet


def test_aggregate_weights_means_by_count_and_sums():
    a = extract(parse(pod_doc(loss_b1_g2=0.01, count_b1_g2=10)), 0.0)
    b = extract(parse(pod_doc(loss_b1_g2=0.04, count_b1_g2=30, drafted=300, accepted=90, state="offloaded")), 0.0)
    st = aggregate({"a": a, "b": b})
    assert st.pods == 2
    mean, n = st.planner[(1, 2, "draft")]
    assert n == 40 and mean == pytest.approx((0.01 * 10 + 0.04 * 30) / 40)
    assert st.planner[(1, 2, "ngram")] == (pytest.approx(0.007), 12.0)  # the same gamma of another source apart
    assert st.acceptance[2] == pytest.approx(150 / 400)
    assert st.acceptance[4] == 0.5
    assert st.switch_cost_mean_s == pytest.approx(0.03)
    assert st.running == 4 and st.waiting == 2
    assert st.draft_states == {"resident": 1, "offloaded": 1}
    # the draft prefill price: the median of the pods that know it (one odd pod does not move it)
    odd = extract(parse(pod_doc(draft_prefill=0.5)), 0.0)
    unknown = extract(parse(pod_doc(draft_prefill=0)), 0.0)
    assert aggregate({"a": a, "b": b, "c": odd, "d": unknown}).draft_prefill_s == 0.006
    assert aggregate({"d": unknown}).draft_prefill_s is None
    assert st.ttft is not None and st.ttft.observations == 20
    # 10 of 20 below 0.1 -> p50 = 0.1 exactly; p95: rank 19 in (0.1, 0.5]: 0.1 + 0.4 * 9/8... capped by bucket
    assert st.ttft_p50_s == pytest.approx(0.1)
    assert st.ttft_p95_s == pytest.approx(0.5)  # rank 19 > 18 -> in +Inf bucket -> largest finite bound
    assert st.throughput_tok_s is None  # no window yet


def test_window_deltas_rates_and_reset():
    p0 = extract(parse(pod_doc(drafted=100, accepted=60, ttft=(5, 9, 10), gen=1000)), ts=10.0)
    p1 = extract(parse(pod_doc(drafted=200, accepted=80, ttft=(5, 19, 20), gen=1500)), ts=20.0)
    w = window(p0, p1)
    assert w.window_s == 10.0
    assert w.draft_tokens == {2: 100.0} and w.accepted_tokens == {2: 20.0}
    assert w.ttft is not None and w.ttft.buckets == ((0.1, 0.0), (0.5, 10.0), (math.inf, 10.0))
    st = aggregate({"p": w})
    assert st.throughput_tok_s == pytest.approx(50.0)
    assert st.acceptance[2] == pytest.approx(0.2)
    # restart of the worker: counters went down -> the current values form the window
    p2 = extract(parse(pod_doc(drafted=10, accepted=5, ttft=(1, 1, 1), gen=30)), ts=30.0)
    w2 = window(p1, p2)
    assert w2.draft_tokens == {2: 10.0} and w2.generation_tokens == 30 and w2.ttft.observations == 1


def test_empty_and_partial_scrapes():
    st = aggregate({"x": extract(parse("up 1\n"), 0.0)})
    assert st.pods == 1 and st.planner == {} and st.ttft is None and st.requests == 0
    assert aggregate({}).pods == 0


def test_window_of_a_pod_first_seen_now_is_empty():
    p = extract(parse(pod_doc()), ts=5.0)
    w = window(p, p)
    assert w.window_s == 0 and w.generation_tokens == 0 and w.ttft.observations == 0
    assert aggregate({"p": w}).throughput_tok_s is None


def test_escaped_vllm_names_as_read_through_prometheus():
    doc = pod_doc().replace("vllm:", "vllm_")
    pm = extract(parse(doc), 0.0)
    assert pm.ttft is not None and pm.tpot is not None and pm.generation_tokens == 1000 and pm.running == 2


def test_elastic_memory_condition_from_the_workers_reasons():
    from nightjar_operator.fleet.memory import evaluate_memory

    doc = pod_doc() + 'nightjar_memory_offload_enabled{reason="cuda_kv_release_unverified"} 0\n'
    gpu = extract(parse(doc), 0.0)
    cpu = extract(parse(pod_doc() + 'nightjar_memory_offload_enabled{reason="enabled"} 1\n'), 0.0)
    assert gpu.offload == "cuda_kv_release_unverified" and cpu.offload == "enabled"
    st = aggregate({"a": gpu, "b": cpu, "c": extract(parse(pod_doc()), 0.0)})
    assert st.offload == {"cuda_kv_release_unverified": 1, "enabled": 1}
    ev = evaluate_memory("Auto", st.offload)
    assert (ev.status, ev.reason) == ("False", "Unavailable")
    assert "1/2 pods serve with the draft always resident (1 pods: cuda_kv_release_unverified)" in ev.message
    assert evaluate_memory("Auto", {"enabled": 3}).status == "True"
    assert evaluate_memory("Auto", {}).status == "Unknown"
    assert evaluate_memory("Never", {"disabled": 2}).reason == "Disabled"
