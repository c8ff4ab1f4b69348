"""Shared by the benchmarks: the machine (CPU model, bf16 flags), its measured fp32 and bf16
matmul peaks, and timing helpers."""

from __future__ import annotations

import statistics
import time

import torch

from temper.precision import machine


def matmul_peak_gflops(size: int = 2048, repeats: int = 10, dtype: torch.dtype = torch.float32) -> float:
    """Best-of GEMM throughput of this machine (torch, all threads) in `dtype`, in GFLOP/s.

    MFU is measured against the fp32 figure rather than the datasheet peak: it is what torch can
    reach here. The bf16 figure says whether bf16 can pay at all: ~7x fp32 at 2048^2 with AMX,
    ~0.2x on AVX-512 without AVX512-BF16, ~0.01x on AVX2 (BENCHMARKS.md)."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def machine_line() -> str:
    """The CPU and what decides its bf16 speed, for a table header: figures differ by machine."""
    m = machine()
    flags = set(m["flags"])
    amx = "yes" if {"amx_bf16", "amx_tile"} & flags else "no"
    return (
        f"{m['cpu']} ({m['cpu_capability']}; AMX {amx}, AVX512-BF16 {'yes' if 'avx512_bf16' in flags else 'no'}), "
        f"torch {m['torch']}, {m['threads']} threads"
    )


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters that take part in matmuls: all but the input embedding (a table lookup)."""
    embed = model.get_input_embeddings().weight.numel()
    return sum(p.numel() for p in model.parameters()) - embed


def median(xs: list[float]) -> float:
    return statistics.median(xs)


class NoEos:
    """A tokenizer whose eos id the model cannot produce, so every sample runs to full length."""

    def __init__(self, tokenizer, never: int):
        self._tokenizer, self.eos_token_id = tokenizer, never

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def best_time(fn, repeats: int) -> float:
    """Fastest of `repeats` timed calls after one warm-up call, in seconds."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)
