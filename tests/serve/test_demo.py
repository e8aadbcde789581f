"""The demo's table and plot from a synthetic timeline (the demo itself runs the real worker:
``make demo``)."""

from __future__ import annotations

from nightjar_worker import demo
from nightjar_worker.loadgen import RequestRecord


def tick(t: float, segment: str, state: int, kv: float, demand: float = 0.0, recheck: float = 0.0) -> demo.Tick:
    return demo.Tick(t=t, segment=segment, gamma={"draft": None, "ngram": 3.0}, share={"draft": 0.0, "ngram": 1.0},
                     drafted={"draft": 0.0, "ngram": 30.0}, accepted={"draft": 0.0, "ngram": 15.0}, running=1.0,
                     waiting=0.0, tok_s=20.0, draft_state=state, kv_blocks=kv,
                     returns={"demand": demand, "recheck": recheck})


def test_table_and_plot_show_the_draft_leaving_and_returning(tmp_path):
    segs = demo.segments(1.0, 2)
    for i, s in enumerate(segs):
        s.t0, s.t1 = 10.0 * i, 10.0 * i + 10.0
        s.records = [RequestRecord(idx=0, qid=0, category="coding", phase=s.name, start_s=s.t0, e2e_s=5.0,
                                   output_tokens=100 * (1 + (i > 0)))]
    ticks = [tick(1, "gamma 0", 0, 529), tick(11, "nightjar", 0, 529), tick(21, "load", 2, 589),
             tick(29, "load", 4, 529, recheck=1), tick(31, "nightjar again", 0, 529, recheck=1)]
    rows = demo.summary_table(segs, ticks).splitlines()
    cells = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in rows[2:]}
    assert cells["nightjar"][2] == "2.00"  # tok/s against gamma 0 on the same prompts
    assert cells["load"][6:] == ["0 / 1", "draining", "529"]  # the recheck started in the load segment
    assert cells["nightjar again"][6:] == ["0 / 0", "resident", "529"]
    demo.plot(ticks, segs, tmp_path / "demo.png", "test")
    assert (tmp_path / "demo.png").stat().st_size > 10_000


def test_elastic_memory_env_sizes_the_pool_for_a_pair_whose_draft_needs_it():
    import json

    from nightjar_worker.models import elastic_memory_env

    qwen = elastic_memory_env("qwen", {"enabled": True, "mode": "offloaded"})
    # the Qwen draft's 3.6 GB would leave the default 2 GiB pool no base blocks: the worker refuses
    assert float(qwen["VLLM_CPU_KVCACHE_SPACE"]) > 2
    assert json.loads(qwen["NIGHTJAR_MEMORY"]) == {"enabled": True, "mode": "offloaded", "reload_slice_s": 0.1}
    assert json.loads(elastic_memory_env("qwen", {"reload_slice_s": 0.5})["NIGHTJAR_MEMORY"])["reload_slice_s"] == 0.5
    assert elastic_memory_env("bundled", {"enabled": True}) == {"NIGHTJAR_MEMORY": '{"enabled": true}'}
