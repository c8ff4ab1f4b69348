"""Shared by the benchmarks: the machine's measured fp32 matmul peak and timing helpers."""

from __future__ import annotations

import statistics
import time

import torch


def matmul_peak_gflops(size: int = 2048, repeats: int = 10) -> float:
    """Best-of fp32 GEMM throughput of this machine (torch, all threads), in GFLOP/s.

    MFU is measured against this rather than the datasheet peak: it is what torch can reach here
    (shared/research/cpu-performance.md: ~80-105 GFLOP/s on 2 Zen3 cores)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


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
