"""The all-gather + GEMM op of issue 13: C_r = all_gather(A) @ B_r, with the gather split into chunks.

Layout (tensor-parallel column-parallel linear, as in Triton-distributed's AG-GEMM and Megatron's sequence
parallelism): rank r holds A_r, its [M/world, K] row shard of the activations, and B_r, a [K, N/world] column
shard of the weights; it returns its [M, N/world] column block of C = A @ B. B is sharded rather than
replicated because a replicated B would have every rank compute the same full C: the compute per rank would
not shrink with the world and the communication share would be unrealistically small.

Chunking: chunk j gathers the j-th slice of every rank's shard (rows j*mc .. (j+1)*mc of each A_r, mc =
M/world/chunks) into its own contiguous [world*mc, K] buffer with all_gather_into_tensor, so the GEMM of chunk j
can start as soon as gather j has landed. Its output rows are world segments of mc rows, one per source rank,
m = M/world rows apart in C: the kernel stores row i at (i // SEG_M) * SEG_STRIDE + i % SEG_M (chunks=1 is the
identity), which keeps C in its plain row order without a permuting copy that only chunked points would pay.

Function space (what Triton-distributed-style function tuning picks):
  chunks       the number of gather pieces (each GEMM launch then has M = world * mc rows: its Triton key
               changes with chunks, so its best kernel config does too)
  comm_stream  same    : gathers on the current stream (no overlap; no stream or event overhead)
               side    : gathers on a side stream; GEMM chunk j waits on chunk j's event
               side_hi : as side, with a high-priority side stream and a process group whose NCCL stream is
                         high priority (the NCCL kernels run on the group's internal stream, so the side
                         stream's own priority alone would not reach them)
On the CPU (gloo, TRITON_INTERPRET=1) streams and events are no-ops and every setup runs the same code path.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner, Config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import host_do_bench, interpreting  # noqa: E402

# In this order: importing mlp_ops puts examples/ on sys.path, where mlp_kernels is. config_text and tolerance
# are not used here: bench_ag_gemm imports them from here.
# isort: off
from mlp_ops import config_text, fresh_autotuner, launch, tolerance, triton_key  # noqa: E402, F401
from mlp_kernels import matmul_tile  # noqa: E402  (examples/, put on sys.path by mlp_ops)
# isort: on

# torch >= 2.12 deprecates the name in favour of all_gather_single, which older torch lacks; the GPU runs use 2.11.
warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.* is deprecated", category=FutureWarning)

COMM_SETUPS = ("same", "side", "side_hi")
CHUNKS = {"large": (1, 2, 4, 8), "small": (1, 2, 4)}

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): H200 bf16 tiles from large (few programs per chunk of a
# big M) to small (enough programs to fill 132 SMs when a chunk has only ~1k rows).
_LARGE = [
    (128, 256, 64, 3, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 4), (128, 128, 64, 3, 8),
    (128, 128, 128, 3, 8), (128, 256, 32, 4, 8), (64, 256, 64, 4, 4), (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4), (64, 128, 128, 3, 4), (64, 64, 64, 4, 4), (256, 64, 64, 4, 4),
]
# The interpreter runs one program at a time on the host: three small tiles keep the smoke run quick.
_SMALL = [(16, 16, 16, 1, 4), (16, 32, 32, 1, 4), (32, 16, 32, 1, 4)]


def space_size() -> str:
    """'small' under the interpreter, else 'large'; TRITON_CTX_TUNE_EXAMPLE_SIZE overrides it, as for the MLP."""
    size = os.environ.get("TRITON_CTX_TUNE_EXAMPLE_SIZE") or ("small" if interpreting() else "large")
    if size not in ("small", "large"):
        raise ValueError(f"TRITON_CTX_TUNE_EXAMPLE_SIZE={size!r}: expected 'small' or 'large'")
    return size


def gemm_configs(size: str) -> list[Config]:
    table = {"small": _SMALL, "large": _LARGE}[size]
    return [Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_stages=s, num_warps=w)
            for bm, bn, bk, s, w in table]


@triton.autotune(configs=gemm_configs(space_size()), key=["M", "N", "K"])
@triton.jit
def ag_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     SEG_M, SEG_STRIDE,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """c[row(i)] = a[i] @ b with fp32 accumulation, row(i) = (i // SEG_M) * SEG_STRIDE + i % SEG_M."""
    acc, offs_m, offs_n = matmul_tile(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    rows = (offs_m // SEG_M) * SEG_STRIDE + offs_m % SEG_M
    c_ptrs = c_ptr + rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def fresh_gemm() -> Autotuner:
    """A new Autotuner and JITFunction for the same kernel: empty tuning and compile caches (one per arm)."""
    # Triton's own do_bench needs a GPU driver; the host-clock stand-in keeps plain Autotuner.run usable.
    return fresh_autotuner(ag_matmul_kernel, host_do_bench if interpreting() else None)


@dataclass(frozen=True, order=True)
class Point:
    """One point of the function space."""
    chunks: int
    comm_stream: str

    def kwargs(self) -> dict[str, Any]:
        return {"chunks": self.chunks, "comm_stream": self.comm_stream}

    def text(self) -> str:
        return f"chunks={self.chunks}, comm_stream={self.comm_stream}"


def function_space(chunks: tuple[int, ...], comm: tuple[str, ...] = COMM_SETUPS) -> list[Point]:
    return [Point(c, s) for c, s in itertools.product(chunks, comm)]


class Comm:
    """The process groups and streams of each comm_stream setup; built once, on every rank (new_group is
    collective)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.groups: dict[str, Any] = {"same": None, "side": None, "side_hi": self._high_priority_group()}
        self.streams: dict[str, torch.cuda.Stream | None] = {"same": None, "side": None, "side_hi": None}
        if cuda:
            self.streams["side"] = torch.cuda.Stream()
            self.streams["side_hi"] = torch.cuda.Stream(priority=-1)

    def _high_priority_group(self) -> Any:
        if not self.cuda or dist.get_backend() != "nccl":
            return dist.new_group()  # gloo: still a group of its own, so the CPU path is the GPU path
        opts = dist.ProcessGroupNCCL.Options()
        opts.is_high_priority_stream = True
        return dist.new_group(backend="nccl", pg_options=opts)

    @contextlib.contextmanager
    def on(self, setup: str) -> Iterator[torch.cuda.Stream | None]:
        stream = self.streams[setup]
        if stream is None:
            yield None
            return
        # The buffers come from the current stream's pool and may be memory a previous op still reads there.
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            yield stream


class AgGemm:
    """The op on one rank's shards; `gemm` is the Autotuner it launches (each arm brings its own)."""

    def __init__(self, gemm: Autotuner, comm: Comm, world: int) -> None:
        self.gemm, self.comm, self.world = gemm, comm, world

    def __call__(self, a_shard: torch.Tensor, b_shard: torch.Tensor, chunks: int = 1, comm_stream: str = "same",
                 config: Config | None = None) -> torch.Tensor:
        """C_r [world*m, N/world]; config=None launches through the Autotuner, else forces that config."""
        m, K = a_shard.shape
        if m % chunks:
            raise ValueError(f"chunks={chunks} does not split the {m} local rows")
        mc = m // chunks
        c = torch.empty(self.world * m, b_shard.shape[1], dtype=a_shard.dtype, device=a_shard.device)
        # Allocated on the current stream, which reads them last: freed memory is then reused after that read.
        bufs = [torch.empty(self.world * mc, K, dtype=a_shard.dtype, device=a_shard.device) for _ in range(chunks)]
        events = []
        with self.comm.on(comm_stream) as stream:
            for j in range(chunks):
                dist.all_gather_into_tensor(bufs[j], a_shard[j * mc:(j + 1) * mc],
                                            group=self.comm.groups[comm_stream])
                events.append(stream.record_event() if stream is not None else None)
        current = torch.cuda.current_stream() if stream is not None else None
        for j in range(chunks):
            if current is not None:
                current.wait_event(events[j])
            self.matmul(bufs[j], b_shard, c[j * mc:], mc, m, config)
        return c

    def matmul(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, seg_m: int, seg_stride: int,
               config: Config | None) -> None:
        M, N = a.shape[0], b.shape[1]
        launch(self.gemm, lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),),
               self.gemm_args(a, b, c, seg_m, seg_stride), config)

    @staticmethod
    def gemm_args(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, seg_m: int, seg_stride: int) -> tuple:
        M, K = a.shape
        N = b.shape[1]
        return (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                seg_m, seg_stride)

    def chunk_key(self, a_shard: torch.Tensor, b_shard: torch.Tensor, chunks: int) -> tuple:
        """The key Autotuner.run files a GEMM launch of one chunk under (every chunk of a point shares it)."""
        m, K = a_shard.shape
        mc = m // chunks
        a = torch.empty(self.world * mc, K, dtype=a_shard.dtype, device="meta")
        c = torch.empty(self.world * mc, b_shard.shape[1], dtype=a_shard.dtype, device="meta")
        return triton_key(self.gemm, self.gemm_args(a, b_shard, c, mc, m))

    def tuned_config(self, a_shard: torch.Tensor, b_shard: torch.Tensor, chunks: int) -> Config | None:
        return self.gemm.cache.get(self.chunk_key(a_shard, b_shard, chunks))


def make_inputs(M: int, K: int, N: int, seed: int, dtype: torch.dtype, device: torch.device, rank: int,
                world: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A_r, B_r, the float32 reference C_r): full A and B from one seed on every rank, then this rank's shards."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    # Drawn on the CPU (one generator, the same numbers on every rank), rounded to dtype, multiplied on the device.
    a = torch.randn(M, K, generator=g).to(device=device, dtype=dtype)
    b = (torch.randn(K, N, generator=g) / K ** 0.5).to(device=device, dtype=dtype)  # |C| ~ |A| whatever K is
    rows = slice(rank * M // world, (rank + 1) * M // world)
    cols = slice(rank * N // world, (rank + 1) * N // world)
    b_shard = b[:, cols].contiguous()
    ref = a.float() @ b_shard.float()
    return a[rows].contiguous(), b_shard, ref


def check_sizes(M: int, K: int, N: int, world: int, chunks: tuple[int, ...]) -> None:
    if M % world or N % world:
        raise SystemExit(f"--M {M} and --N {N} must split over {world} ranks")
    bad = [c for c in chunks if (M // world) % c]
    if bad:
        raise SystemExit(f"chunks {bad} do not split the {M // world} rows per rank; pick --M accordingly")

