"""Costs measured on an NVIDIA H200 (benchmarks/gpu_check.py, 2026-12-04; CUDA 13.0, sm_90, llama.cpp through
localspec): random-weight Qwen2.5 shapes in Q4_K_M, the target's forward time for a batch of 1..64 tokens, the
0.5B draft's time per token, and localspec's own time per round (outside both models' passes) with draft =
target at k = 4 and 8. Measured facts, copied here as test fixtures: the replay tests (test_gpu_curves.py) show
what auto and the crowd policy choose on a GPU's curve, where a batch of 16 costs about two single tokens."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuCurve:
    name: str
    target_ms: tuple[float, ...]  # T(n) for n = 1..64
    draft_token_ms: float  # the 0.5B draft, per token
    overhead_ms: dict[int, float]  # localspec's own time per round at draft length k

    def target_s(self) -> dict[int, float]:
        return {n: ms / 1e3 for n, ms in enumerate(self.target_ms, start=1)}

    def overhead_s(self, k: int) -> float:
        """localspec's own seconds in a round of k drafts: the line through the two measured points."""
        (k1, o1), (k2, o2) = sorted(self.overhead_ms.items())
        return (o1 + (o2 - o1) / (k2 - k1) * (k - k1)) / 1e3

    def live_target_s(self) -> dict[int, float]:
        """T(n) as auto's rounds time it: the verify pass plus the round's own host work (grading, rollback)."""
        return {n: t + max(self.overhead_s(n - 1), 0.0) for n, t in self.target_s().items()}


H200_1_5B = GpuCurve(
    "h200 qwen2.5-1.5b-shape q4_k_m",
    (
        2.942, 3.852, 3.757, 4.037, 3.991, 4.788, 4.164, 4.451,
        5.490, 5.494, 5.725, 5.701, 5.649, 5.548, 5.728, 5.715,
        6.138, 6.074, 6.190, 6.208, 6.081, 6.229, 6.121, 6.317,
        6.641, 6.664, 6.725, 6.729, 6.644, 6.767, 6.743, 6.898,
        7.011, 7.092, 7.236, 7.228, 7.357, 7.019, 7.162, 7.040,
        7.596, 7.315, 7.732, 7.591, 7.706, 7.450, 7.837, 7.536,
        8.047, 8.283, 8.225, 8.163, 8.249, 8.190, 8.343, 8.471,
        8.124, 8.407, 8.377, 8.639, 8.466, 8.519, 8.486, 8.319,
    ),
    1.186,
    {4: 0.788, 8: 1.290},
)  # fmt: skip

H200_7B = GpuCurve(
    "h200 qwen2.5-7b-shape q4_k_m",
    (
        4.590, 4.929, 5.603, 6.552, 7.305, 8.345, 8.632, 9.466,
        8.711, 8.698, 8.655, 8.787, 8.778, 8.838, 8.928, 9.015,
        9.622, 9.611, 9.676, 9.788, 9.667, 9.723, 9.808, 9.846,
        10.457, 10.448, 10.545, 10.544, 10.631, 10.485, 10.704, 10.687,
        11.340, 11.397, 11.328, 11.453, 11.554, 11.644, 11.513, 11.699,
        12.222, 12.176, 12.181, 12.299, 12.211, 12.337, 12.332, 12.462,
        13.277, 13.613, 13.283, 13.509, 13.582, 13.674, 13.573, 13.777,
        13.791, 13.614, 13.626, 13.810, 13.745, 13.870, 14.501, 13.863,
    ),
    1.359,
    {4: 0.989, 8: 1.227},
)  # fmt: skip

H200 = (H200_1_5B, H200_7B)


def cpu_like_s(t1: float = 0.035) -> dict[int, float]:
    """A 2-core CPU's shape for comparison (the 1.5B there: a batch of 4 costs about 3x one token, 16 about 8x)."""
    return {n: t1 * (1.0 + 0.47 * (n - 1)) for n in range(1, 65)}
