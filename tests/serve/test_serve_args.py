"""``nightjar-worker serve`` argument building (what vLLM is asked to run) and the CLI dispatch."""

from __future__ import annotations

import json

import pytest
from nightjar_worker import cli
from nightjar_worker.engine.engine_args import NIGHTJAR_SCHEDULER_CLS
from nightjar_worker.serve import build_parser, parse_spec_table, vllm_argv


def argv(*a):
    args, rest = build_parser().parse_known_args(list(a))
    return vllm_argv(args, rest)


def opt(av, name):
    return av[av.index(name) + 1]


def test_nightjar_defaults_use_the_pair_k_from_config_and_our_scheduler(pair):
    t, d = pair
    av = argv("--port", "9001", "--max-num-seqs", "64")
    assert opt(av, "--model") == str(t) and opt(av, "--port") == "9001"
    spec = json.loads(opt(av, "--speculative-config"))
    assert spec == {"method": "draft_model", "model": str(d), "num_speculative_tokens": 3}
    assert opt(av, "--scheduler-cls") == NIGHTJAR_SCHEDULER_CLS
    assert opt(av, "--middleware") == "nightjar_worker.admin.AdminMiddleware"
    assert av[-2:] == ["--max-num-seqs", "64"]  # passthrough last: the user wins


def test_baselines_use_vllms_own_scheduler(pair):
    av = argv("--scheduler", "vllm", "--draft", "none")
    assert "--speculative-config" not in av and "--scheduler-cls" not in av
    av = argv("--scheduler", "vllm", "--num-speculative-tokens", "2")
    assert json.loads(opt(av, "--speculative-config"))["num_speculative_tokens"] == 2
    av = argv("--scheduler", "vllm", "--spec-per-batch-size", '{"1": 4, "8": 1}')
    spec = json.loads(opt(av, "--speculative-config"))
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 7, 4], [8, 1 << 20, 1]]
    assert spec["num_speculative_tokens"] == 4


def test_bad_arguments_name_the_option(pair, tmp_path):
    with pytest.raises(SystemExit, match="--spec-per-batch-size"):
        argv("--spec-per-batch-size", '{"1": 4}')  # only with --scheduler vllm
    with pytest.raises(SystemExit, match="--draft"):
        argv("--draft", str(tmp_path / "missing"))
    with pytest.raises(SystemExit, match="--model"):
        argv("--model", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="batch size 1"):
        parse_spec_table({"2": 1})


def test_cli_dispatch_and_usage(capsys):
    assert cli.main([]) == 2
    assert cli.main(["bogus"]) == 2
    assert "unknown command" in capsys.readouterr().err
    assert cli.main(["--help"]) == 0


def test_dtype_is_passed_and_float32_flushes_denormals_in_every_vllm_process(pair, monkeypatch, tmp_path):
    from nightjar_worker.serve import prepare_environment

    assert opt(argv(), "--dtype") == "bfloat16"
    args, rest = build_parser().parse_known_args(["--dtype", "float32"])
    assert opt(vllm_argv(args, rest), "--dtype") == "float32"
    monkeypatch.setenv("NIGHTJAR_STATE_DIR", str(tmp_path / "state"))
    for k in ("NIGHTJAR_FLUSH_DENORMAL", "PROMETHEUS_MULTIPROC_DIR", "VLLM_CPU_KVCACHE_SPACE", "NIGHTJAR_CONFIG"):
        monkeypatch.setenv(k, "")  # recorded, so teardown removes what prepare_environment exports
        monkeypatch.delenv(k)
    assert prepare_environment(args)["NIGHTJAR_FLUSH_DENORMAL"] == "1"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--dtype", "int8"])


def test_hub_ids_and_revisions_reach_vllm(pair):
    av = argv("--model", "Qwen/Qwen2.5-7B-Instruct", "--revision", "main", "--draft", "Qwen/Qwen2.5-0.5B-Instruct",
              "--draft-revision", "a1b2c3")
    assert opt(av, "--model") == "Qwen/Qwen2.5-7B-Instruct" and opt(av, "--revision") == "main"
    spec = json.loads(opt(av, "--speculative-config"))
    assert spec["model"] == "Qwen/Qwen2.5-0.5B-Instruct" and spec["revision"] == "a1b2c3"
    assert opt(av, "--served-model-name") == "Qwen/Qwen2.5-7B-Instruct"
    with pytest.raises(SystemExit, match="--model: .* neither a model directory nor a Hugging Face Hub repo id"):
        argv("--model", "s3://bucket/model")
    with pytest.raises(SystemExit, match="--draft-revision"):
        argv("--draft", "none", "--draft-revision", "x")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_engine_options_per_device_parse_with_vllms_own_parser(pair, device):
    """The one options function gives CUDA graphs on CUDA (eager on CPU) and async scheduling off on
    both; vLLM's own API-server parser turns the flags back into the same engine arguments."""
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    t, d = pair
    av = argv("--device", device)
    ea = AsyncEngineArgs.from_cli_args(make_arg_parser(FlexibleArgumentParser()).parse_args(av))
    assert ea.enforce_eager is (device == "cpu")
    assert ea.async_scheduling is False
    assert ea.model == str(t) and ea.scheduler_cls == NIGHTJAR_SCHEDULER_CLS
    assert ea.speculative_config["model"] == str(d)
    eager = argv("--device", "cuda", "--eager")
    assert "--enforce-eager" in eager
