"""Move the draft's parameters to host memory and back, asynchronously (runs in the worker process).

One code path for every device, parameterised by ``device``:

* the copies run in a background thread (so the worker keeps stepping the target, in AR mode),
  inside ``torch.cuda.stream(side_stream)`` on CUDA (a side stream, so they overlap the compute
  stream) and a null context on CPU;
* every copy is ``dst.copy_(src, non_blocking=True)`` followed by one synchronisation of the side
  stream (a no-op on CPU, where copies are synchronous);
* the host tier is chosen by the device: pinned host memory on CUDA (what makes ``non_blocking``
  truly asynchronous), and on CPU, where "device" and "host" are the same RAM, a file-backed
  mapping that is unmapped after the copy so the bytes leave the process's resident set (they sit
  in the page cache / on disk until the reload maps them back).

The host copy is written once (on the first offload) and kept: the draft's weights never change,
so later offloads only free the device tensors. Parameters that share storage with the target
(e.g. tied embeddings vLLM shares between draft and target) are never moved.

Step contract: ``start_offload()`` / ``start_reload()`` return a ``MoveTask`` immediately; the
caller polls ``task.done`` (a stepped reload does its work only inside ``task.advance(budget_s)``,
called between engine steps). The draft must not run between ``start_offload`` and a completed
reload (the scheduler holds gamma at 0: see ``manager.py``); a failed reload leaves the draft
offloaded and its parameters empty, so the device memory budget is still respected.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import torch

from .fault import FaultInjector
from .fileio import pread_into, pwrite

log = logging.getLogger("nightjar.memory")
CANCELLED = "cancelled"


@dataclass
class MoveTask:
    """A background copy; ``done`` flips once, then ``error`` / ``duration_s`` are final."""

    kind: str  # "offload" | "reload"
    started_s: float = field(default_factory=time.monotonic)
    done: bool = False
    error: str | None = None
    duration_s: float = 0.0
    bytes_moved: int = 0
    busy_s: float = 0.0  # time spent working (stepped: the sum of the slices)
    slices: int = 0
    _thread: threading.Thread | None = None
    _steps: Generator[None, None, None] | None = None  # stepped mode: the remaining work, advanced by the caller
    _finish: Callable[[], None] | None = None

    def advance(self, budget_s: float) -> bool:
        """Stepped mode: do work items on the calling thread until ``budget_s`` is spent (at least one
        item). No-op for a threaded task. Returns ``done``."""
        if self._steps is None or self.done:
            return self.done
        t0 = time.monotonic()
        self.slices += 1
        try:
            while True:
                next(self._steps)
                if time.monotonic() - t0 >= budget_s:
                    break
        except StopIteration:
            self._steps = None
        except Exception as e:  # noqa: BLE001 - reported like a threaded failure
            self._steps = None
            self.error = f"{type(e).__name__}: {e}"
            log.warning("nightjar memory: draft %s failed: %s", self.kind, self.error)
        finally:
            self.busy_s += time.monotonic() - t0
        if self._steps is None and self._finish is not None:
            self._finish()
        return self.done

    @property
    def cancelled(self) -> bool:
        """Stopped by ``cancel()`` (stepped only)."""
        return self.error == CANCELLED

    def cancel(self) -> bool:
        """Stepped mode: stop at once, between work items; the work discards what it did (a reload
        frees the weights it had brought back). A threaded task (CUDA: a reload of about a second)
        is left to finish: with several workers, some could finish before seeing a flag and leave
        the draft resident on part of them. Returns whether the task was cancelled."""
        if self.done or self._steps is None:
            return False
        self._steps.close()  # GeneratorExit at the paused item: the work's own cleanup runs
        self._steps = None
        self.error = CANCELLED
        if self._finish is not None:
            self._finish()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        if self._steps is not None:
            self.advance(float("inf"))
        if self._thread is not None:
            self._thread.join(timeout)
        return self.done


class HostStore:
    """Where offloaded bytes live: ``write``/``read_into`` move a flat uint8 tensor at an offset.

    Pinned/memory: a host buffer, ``copy_(non_blocking=True)`` (asynchronous from a CUDA side stream).
    File (CPU): plain ``write``/``readinto`` system calls, never a mapping, so the bytes never count in
    the worker's resident set (they sit in the page cache / on disk)."""

    def __init__(self, nbytes: int, device: torch.device, kind: str = "auto", directory: str | None = None) -> None:
        if kind == "auto":
            kind = "pinned" if device.type == "cuda" else "file"
        if kind not in ("pinned", "memory", "file"):
            raise ValueError(f"host_store: expected auto|pinned|memory|file, got {kind!r}")
        self.kind, self.nbytes = kind, nbytes
        self._buf: torch.Tensor | None = None
        self._path: str | None = None
        if kind == "file":
            d = directory or os.environ.get("NIGHTJAR_OFFLOAD_DIR") or tempfile.gettempdir()
            os.makedirs(d, exist_ok=True)
            fd, self._path = tempfile.mkstemp(prefix="nightjar-draft-", suffix=".bin", dir=d)
            os.ftruncate(fd, max(1, nbytes))
            os.close(fd)
        else:
            self._buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=(kind == "pinned"))

    def write(self, offset: int, src: torch.Tensor) -> None:
        if self._buf is not None:
            self._buf[offset : offset + src.numel()].copy_(src, non_blocking=True)
        else:
            assert self._path is not None
            pwrite(self._path, offset, src)

    def read_into(self, offset: int, dst: torch.Tensor) -> None:
        if self._buf is not None:
            dst.copy_(self._buf[offset : offset + dst.numel()], non_blocking=True)
        else:
            assert self._path is not None
            pread_into(self._path, offset, dst)

    def close(self) -> None:
        self._buf = None
        if self._path and os.path.exists(self._path):
            os.unlink(self._path)
        self._path = None


def _release_freed_heap() -> None:
    """Return freed heap pages to the OS (glibc keeps them otherwise); CPU only, best effort."""
    name = ctypes.util.find_library("c")
    if not name:
        return
    with contextlib.suppress(Exception):
        ctypes.CDLL(name).malloc_trim(0)


class DraftWeightMover:
    def __init__(
        self,
        module: torch.nn.Module,
        device: torch.device | str,
        shared_with: torch.nn.Module | None = None,
        host_store: str = "auto",
        offload_dir: str | None = None,
        faults: FaultInjector | None = None,
        on_done: Callable[[MoveTask], None] | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.faults = faults or FaultInjector()
        self.on_done = on_done
        shared = set()
        if shared_with is not None:
            shared = {p.untyped_storage().data_ptr() for p in shared_with.parameters() if p.numel()}
        seen: set[int] = set()
        self.params: list[tuple[str, torch.nn.Parameter]] = []
        self.shared_names: list[str] = []
        for name, p in module.named_parameters():
            ptr = p.untyped_storage().data_ptr()
            if p.numel() and ptr in shared:
                self.shared_names.append(name)
                continue
            if id(p) in seen:
                continue
            seen.add(id(p))
            self.params.append((name, p))
        # Layout of the flat host copy (aligned so every slice can be viewed as its dtype).
        self.meta: list[tuple[int, torch.Size, torch.dtype]] = []
        off = 0
        for _, p in self.params:
            self.meta.append((off, p.shape, p.dtype))
            off += (p.numel() * p.element_size() + 63) // 64 * 64
        self.nbytes = off
        # CPU: linear layers whose weights vLLM packed into opaque handles (see cpu_packed.py).
        self.packed = [(n, m) for n, m in module.named_modules() if hasattr(m, "_nightjar_packed")]
        self.packed_bytes = sum(self._packed_nbytes(m) for _, m in self.packed)
        self.param_bytes: int = sum(int(p.numel() * p.element_size()) for _, p in self.params) + self.packed_bytes
        self._store = HostStore(self.nbytes, self.device, host_store, offload_dir)
        self._host_valid = False
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.resident = True  # device copy complete
        self.usable = True  # the draft may run: False from the offload request to a completed reload
        self.task: MoveTask | None = None

    # -- one copy loop for both directions and every device -----------------------------------------
    def _stream_ctx(self) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()

    def _sync(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    def _copy_to_host(self) -> int:
        with self._stream_ctx():
            for (off, _, _), (_, p) in zip(self.meta, self.params, strict=True):
                if p.numel():
                    self._store.write(off, p.data.contiguous().view(-1).view(torch.uint8))
        self._sync()
        return self.param_bytes

    @staticmethod
    def _packed_nbytes(m: torch.nn.Module) -> int:
        info = m._nightjar_packed
        return int(info.nbytes if info.remove_weight else m.weight.numel() * m.weight.element_size())

    def _free_device(self) -> None:
        from . import cpu_packed

        for _, m in self.packed:
            cpu_packed.drop(m)
        empty = [torch.empty(0, dtype=p.dtype, device=self.device) for _, p in self.params]
        for (_, p), e in zip(self.params, empty, strict=True):
            p.data = e
        if self.device.type == "cpu":
            _release_freed_heap()
        elif self.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- async API ------------------------------------------------------------------------------------
    def _run(self, task: MoveTask, work: Generator[None, None, int], stepped: bool = False) -> MoveTask:
        """Run ``work`` (a generator that yields between items and returns the bytes moved) in a
        background thread, or, ``stepped``, leave it to ``task.advance`` on the caller's thread."""
        if self.task is not None and not self.task.done:
            raise RuntimeError(f"draft weights: a {self.task.kind} is still running")
        result: dict[str, int] = {}

        def body() -> Generator[None, None, None]:
            result["bytes"] = yield from work

        def finish() -> None:
            task.bytes_moved = result.get("bytes", 0)
            task.duration_s = time.monotonic() - task.started_s
            task.done = True
            if self.on_done is not None:
                self.on_done(task)

        self.task = task
        task._finish = finish
        if stepped:
            task._steps = body()
            return task

        def target() -> None:
            # No lowered OS priority on purpose: this thread takes the GIL between copies, and a
            # starved low-priority GIL holder stalls the decoding thread (priority inversion, measured).
            t0 = time.monotonic()
            try:
                for _ in body():
                    pass
            except Exception as e:  # noqa: BLE001 - any failure is reported, never raised into the worker loop
                task.error = f"{type(e).__name__}: {e}"
                log.warning("nightjar memory: draft %s failed: %s", task.kind, task.error)
            finally:
                task.busy_s = time.monotonic() - t0
                finish()

        th = threading.Thread(target=target, name=f"nightjar-draft-{task.kind}", daemon=True)
        task._thread = th
        th.start()
        return task

    def start_offload(self) -> MoveTask:
        if not self.resident:
            raise RuntimeError("draft weights: offload requested but the draft is not resident")
        self.usable = False  # before the copy thread starts: no draft forward from now on

        def work() -> Generator[None, None, int]:
            moved = 0
            if not self._host_valid:
                moved = self._copy_to_host()
                self._host_valid = True
            self._free_device()
            self.resident = False
            return moved
            yield  # a generator with no yield point: the offload runs as one item

        return self._run(MoveTask("offload"), work())

    def start_reload(self, slice_bytes: int = 0, stepped: bool = False) -> MoveTask:
        """Bring the draft back. ``stepped``: nothing runs until the caller advances the task between
        engine steps (CPU, where re-packing the GEMM weights competes with decoding for the cores);
        otherwise a background thread (CUDA: copies on a side stream). ``slice_bytes`` > 0 bounds one
        work item: reads and packs of larger tensors are split."""
        if self.resident:
            raise RuntimeError("draft weights: reload requested but the draft is resident")
        if stepped and self._stream is not None:
            # the side-stream context must not stay current on the engine thread between slices
            raise ValueError("draft weights: a stepped reload is for CPU; CUDA copies run in a thread on a side stream")
        return self._run(MoveTask("reload"), self._reload_work(slice_bytes), stepped=stepped)

    def _reload_work(self, slice_bytes: int) -> Generator[None, None, int]:
        from . import cpu_packed

        self.faults.check_reload()
        new: list[torch.Tensor] = []
        with self._stream_ctx():  # allocation failures surface here, before any swap
            for off, shape, dtype in self.meta:
                t = torch.empty(shape, dtype=dtype, device=self.device)
                flat = t.view(-1).view(torch.uint8)
                step = slice_bytes if slice_bytes > 0 else max(1, flat.numel())
                for a in range(0, flat.numel(), step):
                    self._store.read_into(off + a, flat[a : a + step])
                    yield
                new.append(t)
        self._sync()
        try:
            for (_, p), t in zip(self.params, new, strict=True):
                p.data = t
            for _, m in self.packed:
                info = m._nightjar_packed
                yield from cpu_packed.repack_steps(m, info.load() if info.remove_weight else None, slice_bytes)
        except BaseException:
            self._free_device()  # all or nothing: a half-restored draft must not stay in memory
            raise
        self.resident = True
        self.usable = True
        return self.param_bytes

    def device_bytes(self) -> int:
        plain = sum(int(p.numel() * p.element_size()) for _, p in self.params)
        return plain + (self.packed_bytes if self.resident else 0)

    def close(self) -> None:
        self._store.close()
