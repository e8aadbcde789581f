"""CPU backend: keep a way back to the draft's linear weights that vLLM packs at load time.

On CPU, vLLM 0.32's ``dispatch_cpu_unquantized_gemm`` (``model_executor/layers/utils.py``) turns every
linear layer's weight into an opaque packed handle (oneDNN, or sgl-kernel with AMX) captured in
``layer.cpu_linear`` and replaces ``layer.weight`` with an empty parameter. Those bytes are not
parameters, so they cannot be copied out and back like the rest of the draft. While the draft is
being loaded (``SpecDecodeBaseProposer.load_model``), and only when elastic memory is enabled, this
hook writes each linear's unpacked weight to a file (the host tier, outside the process's RSS) and
marks the layer. Offload then drops ``layer.cpu_linear`` (freeing the packed copy); reload reads
the weight back and packs it again (vLLM's own dispatch, or row blocks for large weights). CUDA
never packs: nothing is recorded there and the weight mover only sees plain parameters.

Installed from the ``vllm.general_plugins`` entry point in every vLLM process; inert otherwise.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .fileio import pread_into

log = logging.getLogger("nightjar.memory")

_tls = threading.local()
_installed = False


@dataclass
class PackedInfo:
    remove_weight: bool  # True: vLLM dropped layer.weight, the stash is the only copy
    path: str | None = None
    offset: int = 0
    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.bfloat16

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * int(torch.empty(0, dtype=self.dtype).element_size())

    def load(self) -> torch.Tensor:
        assert self.path is not None
        t = torch.empty(self.shape, dtype=self.dtype)
        pread_into(self.path, self.offset, t.view(-1).view(torch.uint8))  # no mapping: no RSS spike
        return t


class _StashFile:
    def __init__(self) -> None:
        d = os.environ.get("NIGHTJAR_OFFLOAD_DIR") or tempfile.gettempdir()
        os.makedirs(d, exist_ok=True)
        fd, self.path = tempfile.mkstemp(prefix="nightjar-draft-packed-", suffix=".bin", dir=d)
        self.f = os.fdopen(fd, "wb")
        self.offset = 0

    def put(self, w: torch.Tensor) -> PackedInfo:
        data = w.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        info = PackedInfo(True, self.path, self.offset, tuple(w.shape), w.dtype)
        self.f.write(data)
        self.f.flush()
        self.offset += len(data)
        return info


_stash: _StashFile | None = None


def _enabled() -> bool:
    try:
        from vllm.config import get_current_vllm_config

        from .config import load_config

        cfg = get_current_vllm_config()
        return load_config(getattr(cfg, "additional_config", None) or {}).enabled
    except Exception as e:  # noqa: BLE001
        log.warning("nightjar memory: could not read the memory config while loading the draft: %s", e)
        return False


def install() -> bool:
    """Wrap vLLM's CPU GEMM dispatch and the proposer's load_model (idempotent)."""
    global _installed
    if _installed:
        return False
    import vllm.model_executor.layers.utils as lu
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    orig_dispatch = lu.dispatch_cpu_unquantized_gemm
    orig_load = SpecDecodeBaseProposer.load_model

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        global _stash
        w = getattr(layer, "weight", None)
        if getattr(_tls, "loading_draft", False) and w is not None and not w.is_meta and w.ndim == 2:
            if remove_weight:
                if _stash is None:
                    _stash = _StashFile()
                layer._nightjar_packed = _stash.put(w)
            else:
                layer._nightjar_packed = PackedInfo(False)
        orig_dispatch(layer, remove_weight)

    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        _tls.loading_draft = _enabled()
        try:
            return orig_load(self, *args, **kwargs)
        finally:
            _tls.loading_draft = False

    dispatch.__wrapped__ = orig_dispatch  # type: ignore[attr-defined]
    lu.dispatch_cpu_unquantized_gemm = dispatch
    SpecDecodeBaseProposer.load_model = load_model
    _installed = True
    return True


def repack_steps(layer: torch.nn.Module, weight: torch.Tensor | None, max_chunk_bytes: int) -> Iterator[None]:
    """Rebuild ``layer.cpu_linear``, yielding after each packing call so a caller can spread the work
    over engine steps. A weight above ``max_chunk_bytes`` (> 0) on vLLM's oneDNN path is packed as
    row blocks of at most that size (one handle each, outputs concatenated): packing the draft's
    49152 x 576 lm_head in one call takes 70-230 ms here, longer than a decode step. Row blocks give
    the same dot products; the target verifies every draft token, so the output cannot change."""
    import vllm.model_executor.layers.utils as lu
    from vllm import _custom_ops as ops

    info: PackedInfo = layer._nightjar_packed
    if info.remove_weight:
        assert weight is not None
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    w = layer.weight
    nbytes = w.numel() * w.element_size()
    if max_chunk_bytes <= 0 or nbytes <= max_chunk_bytes or not _onednn_path(w):
        fn = getattr(lu.dispatch_cpu_unquantized_gemm, "__wrapped__", lu.dispatch_cpu_unquantized_gemm)
        fn(layer, info.remove_weight)
        yield
        return
    rows = max(1, max_chunk_bytes // (w.shape[1] * w.element_size()))
    blocks = []
    for start in range(0, w.shape[0], rows):
        blocks.append((start, start + rows, ops.create_onednn_mm(w[start : start + rows].t(), 32)))
        yield

    def chunked_linear(x: torch.Tensor, _w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return torch.cat([ops.onednn_mm(h, x, None if bias is None else bias[a:b]) for a, b, h in blocks], dim=-1)

    layer.cpu_linear = chunked_linear
    if info.remove_weight:
        layer.weight = torch.nn.Parameter(torch.empty(0, dtype=w.dtype, device=w.device), requires_grad=False)


def _onednn_path(w: torch.Tensor) -> bool:
    """True where vLLM 0.32's dispatch would pack ``w`` with oneDNN (not zentorch, not sgl-kernel, and
    not its fallback to ``torch.nn.functional.linear`` when oneDNN cannot pack the dtype on this CPU)."""
    import vllm.model_executor.layers.utils as lu
    from vllm import _custom_ops as ops
    from vllm.platforms import CpuArchEnum, current_platform

    if current_platform.is_zen_cpu() and hasattr(torch.ops.zentorch, "zentorch_linear_unary"):
        return False
    if lu.check_cpu_sgl_kernel(w.shape[0], w.shape[1], w.dtype):
        return False
    if not ops._supports_onednn or current_platform.get_cpu_architecture() == CpuArchEnum.POWERPC:
        return False
    return _onednn_packs(w.dtype)


@functools.cache
def _onednn_packs(dtype: torch.dtype) -> bool:
    """oneDNN packs ``dtype`` on this CPU (bfloat16 needs AVX512-BF16 or AMX on x86: without them
    vLLM's dispatch catches the RuntimeError and falls back to torch's linear)."""
    from vllm import _custom_ops as ops

    try:
        ops.create_onednn_mm(torch.zeros(64, 64, dtype=dtype).t(), 32)
    except RuntimeError:
        return False
    return True


def _offloaded_linear(*_: Any, **__: Any) -> torch.Tensor:
    raise RuntimeError("nightjar memory: the draft is offloaded; its linear layers cannot run")


def drop(layer: torch.nn.Module) -> None:
    layer.cpu_linear = _offloaded_linear
