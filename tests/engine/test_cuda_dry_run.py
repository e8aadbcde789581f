"""The GPU pod, dry-run on CPU: vLLM's own parser and engine configuration for exactly the arguments
and environment the operator gives the GPU sample's worker pod (``manifests/samples/gpu-pair.yaml``),
with the sample pair's real ``config.json`` files (``tests/fixtures/models``) standing in for the Hub
download, and Triton reported present as on every CUDA install.

What this catches without a GPU: vLLM refusing the pair (vocabulary sizes), unknown or conflicting
flags, the model runner vLLM would build (V2 unless pinned: Nightjar's hooks are on V1), async
scheduling, and any ``torch.cuda`` call in the API server process before vLLM forks its engine core.
What it cannot: anything vLLM's CUDA platform decides at start-up on a real device (attention
backend, CUDA graph capture sizes, memory profiling). Each run imports vLLM in a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures/models"
SAMPLE = ROOT / "manifests/samples/gpu-pair.yaml"

# Runs nightjar-worker (or one function of serve) as the pod's container would, with every torch.cuda
# entry point that reaches the driver recorded, and vLLM's Triton probe answering "present".
PRELUDE = r'''
import atexit, json, os, sys, traceback
import torch

calls = []

def recorded(name, fn):
    def wrapper(*a, **k):
        calls.append({"fn": name, "nvml": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
                      "stack": [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()[:-1]]})
        return fn(*a, **k)
    return wrapper

for n in ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_capability",
          "get_device_properties", "get_device_name", "mem_get_info", "set_device", "synchronize"):
    setattr(torch.cuda, n, recorded(n, getattr(torch.cuda, n)))

import vllm.config.vllm as vllm_config_module
vllm_config_module.HAS_TRITON = True  # as on a CUDA install: vLLM would then choose Model Runner V2

atexit.register(lambda: json.dump({"calls": calls, "initialized": torch.cuda.is_initialized()},
                                  open(os.environ["CUDA_CALLS_OUT"], "w")))
mode, argv = sys.argv[1], sys.argv[2:]
if mode == "serve":
    from nightjar_worker.cli import main
    sys.exit(main(["serve", *argv]))
# "unpinned": vLLM's configuration for serve's vLLM arguments without serve's environment
import dataclasses
from nightjar_worker import serve
args, rest = serve.build_parser().parse_known_args(argv)
print(json.dumps(dataclasses.asdict(serve.dry_run(serve.vllm_argv(args, rest)))))
'''


def gpu_pod(tmp_path: Path, target: Path = FIXTURES / "Qwen3-8B", draft: Path = FIXTURES / "Qwen3-0.6B"
            ) -> tuple[list[str], dict[str, str]]:
    """The worker container's args and plain env for the GPU sample, as the operator renders them,
    with the Hub ids replaced by the fixture folders (what vLLM reads after the download) and the
    pod's mounted paths by temporary ones."""
    from nightjar_operator import constants as c
    from nightjar_operator.reconcile.children import Owner, desired_config_map, desired_deployment
    from nightjar_operator.reconcile.validate import parse_spec

    doc = yaml.safe_load(SAMPLE.read_text())
    spec, errors = parse_spec(doc["spec"])
    assert not errors, errors
    owner = Owner(doc["metadata"]["name"], "default", "uid-1")
    ctr = desired_deployment(owner, spec)["spec"]["template"]["spec"]["containers"][0]
    config = tmp_path / "nightjar.yaml"
    config.write_text(desired_config_map(owner, spec)["data"][c.CONFIG_KEY])
    swap = {"Qwen/Qwen3-8B": str(target), "Qwen/Qwen3-0.6B": str(draft), c.CONFIG_PATH: str(config)}
    args = [swap.get(a, a) for a in ctr["args"]]
    env = {e["name"]: e["value"] for e in ctr["env"] if "value" in e}
    env.update(HOME=str(tmp_path), HF_HOME=str(tmp_path / "hf"), VLLM_CACHE_ROOT=str(tmp_path / "vllm"),
               NIGHTJAR_STATE_DIR=str(tmp_path / "state"))
    return args, env


def run(tmp_path: Path, mode: str, args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, dict]:
    prelude = tmp_path / "prelude.py"
    prelude.write_text(PRELUDE)
    calls = tmp_path / f"cuda-calls-{mode}.json"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "NIGHTJAR_"))}
    full_env = {**base, **env, "CUDA_CALLS_OUT": str(calls), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")}
    (tmp_path / "prom").mkdir(exist_ok=True)
    p = subprocess.run([sys.executable, str(prelude), mode, *args], env=full_env, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    return p, (json.loads(calls.read_text()) if calls.exists() else {})


def report_of(p: subprocess.CompletedProcess) -> dict[str, Any]:
    """The JSON report: serve prints it indented after its own log lines, the unpinned run on one line."""
    lines = p.stdout.strip().splitlines()
    start = max((i for i, line in enumerate(lines) if line == "{"), default=len(lines) - 1)
    return json.loads("\n".join(lines[start:]))


def test_the_gpu_pod_builds_vllms_engine_config_on_the_runner_nightjar_hooks(tmp_path: Path):
    args, env = gpu_pod(tmp_path)
    assert args[args.index("--device") + 1] == "cuda" and env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    p, cuda = run(tmp_path, "serve", [*args, "--dry-run"], env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = report_of(p)
    sample = yaml.safe_load(SAMPLE.read_text())["spec"]
    assert r["model_runner"] == "v1" and r["problem"] is None
    assert r["scheduler_cls"] == "nightjar_worker.engine.scheduler.NightjarScheduler"
    assert r["async_scheduling"] is False
    assert r["enforce_eager"] is False  # CUDA graphs stay on in a GPU pod
    assert r["speculative_method"] == "draft_model"
    assert r["num_speculative_tokens"] == sample["speculation"]["maxGamma"]
    assert r["target_vocab_size"] == r["draft_vocab_size"] == 151936
    assert r["max_model_len"] == 8192  # the sample's vllmArgs win over the worker's default
    # No CUDA before vLLM forks: nothing in this process initialised CUDA; the only probes (xgrammar's
    # tvm_ffi, imported with vLLM's runner) asked NVML, not the CUDA runtime; Nightjar itself asked nothing.
    assert cuda["initialized"] is False
    probes = [c for c in cuda["calls"] if not (c["fn"] in ("is_available", "device_count") and c["nvml"] == "1")]
    assert probes == [], probes
    ours = [c for c in cuda["calls"] if "/nightjar_worker/" in c["stack"][-1] or "/nightjar_operator/" in c["stack"][-1]]
    assert ours == [], ours


def test_without_the_pin_vllm_would_build_model_runner_v2_and_nightjar_refuses_it(tmp_path: Path):
    """Why the pod and the worker pin the runner: with Triton present vLLM 0.32 picks V2 for this
    pair, and the configuration check names the switch."""
    args, env = gpu_pod(tmp_path)
    env.pop("VLLM_USE_V2_MODEL_RUNNER")
    p, _ = run(tmp_path, "unpinned", args, env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = report_of(p)
    assert r["model_runner"] == "v2"
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in r["problem"]


def test_a_pod_asking_for_model_runner_v2_does_not_start(tmp_path: Path):
    args, env = gpu_pod(tmp_path)
    env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    p, _ = run(tmp_path, "serve", [*args, "--dry-run"], env)
    assert p.returncode != 0
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in p.stderr and "V1 model runner" in p.stderr


def test_a_pair_vllm_refuses_fails_the_dry_run(tmp_path: Path):
    """The previous sample's mistake: a 7B-class target with 152064 embedding rows and a small draft
    with 151936 (Qwen2.5-7B with Qwen2.5-0.5B)."""
    target = tmp_path / "target"
    target.mkdir()
    cfg = json.loads((FIXTURES / "Qwen3-8B/config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "vocab_size": 152064}))
    args, env = gpu_pod(tmp_path, target=target)
    p, _ = run(tmp_path, "serve", [*args, "--dry-run"], env)
    assert p.returncode != 0
    assert "same vocabulary size" in p.stdout + p.stderr and "152064" in p.stdout + p.stderr


@pytest.mark.parametrize("flag", ["--no-such-flag=1", "--max-model-len=eight"])
def test_unknown_or_malformed_flags_fail_the_dry_run(tmp_path: Path, flag: str):
    args, env = gpu_pod(tmp_path)
    p, _ = run(tmp_path, "serve", [*args, flag, "--dry-run"], env)
    assert p.returncode != 0
    assert flag.split("=")[0] in p.stderr
