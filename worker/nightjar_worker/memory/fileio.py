"""Positional reads and writes of a tensor's bytes to a file (the CPU host store of the draft's
weights and of vLLM's packed GEMM weights), without mapping the file."""

from __future__ import annotations

import torch


def pwrite(path: str, offset: int, src: torch.Tensor) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(memoryview(src.numpy()))


def pread_into(path: str, offset: int, dst: torch.Tensor) -> None:
    view = memoryview(dst.numpy())
    with open(path, "rb") as f:
        f.seek(offset)
        got = 0
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                raise OSError(f"draft host store {path}: short read at {offset + got}")
            got += n
