"""``attnlab.gemm.sparse``: 2:4 structured-sparse HGEMM (the lab's Observation N).

A matrix A ``[M, K]`` is 2:4 sparse when every group of four consecutive elements of a row holds
at most two non-zeros (``prune_2_4`` makes one from any matrix, keeping the two largest
magnitudes of each group). ``compress_2_4`` stores it as a ``Sparse24``: the two kept values of
each group, in order (``values [M, K / 2]``), and their positions (``meta``, int16
``[M, K / 16]``): the group of columns ``4g .. 4g + 3`` is the 4-bit field ``g % 4`` of
``meta[:, g // 4]``, its low two bits the first kept position, its high two bits the second
(first < second: an all-zero or one-non-zero group keeps zeros in its free places).

``sparse_matmul(a, b)`` is ``A @ b`` on the tensor cores' sparse MMA: half of A's bytes and
half of the MMA instructions of the dense product. On sm_90 that is the warpgroup HGEMM with
``wgmma.mma_async.sp`` (``kernels/gemm/sm90.py`` with ``GemmSpec.sparse``: TMA tails, B in
either layout); elsewhere the ``mma.sync`` HGEMM with ``mma.sp`` (``kernels/gemm/sm80.py``),
whose operands are padded with zeros (which keep the 2:4 pattern) to whole tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from attnlab import device, kernel_cache
from attnlab.config import ConfigError
from attnlab.gemm.api import (
    GEMM_ARCHS,
    NO_EPILOGUE,
    check_c_rows,
    operand_major,
    refuse_autograd,
)
from attnlab.gemm.mma_sync import arch_of, check_b, k_major, run_tiles, tiles
from attnlab.gemm_config import GemmConfig, MmaGemmConfig
from attnlab.kernels.gemm.abi import (
    GEMM_ALIGN_BYTES,
    META_COLUMNS,
    PAD_META,
    SPARSE_BLOCK_K,
    WORDS_K,
    WORDS_ROWS,
    GemmSpec,
)
from attnlab.memo import remember

#: The sparse kernel's default tile: the ladder's best ``mma.sync`` tile (g07x: 128 x 256, XOR
#: swizzle) at a 64-deep K step, on 8 warps of 64 x 64: 16 warps cap a thread at 128
#: registers, where the metadata words push the build into 4 spill stores (cross-compiled).
SPARSE_CONFIG = MmaGemmConfig(block_n=256, block_k=SPARSE_BLOCK_K, warps_m=2, warps_n=4,
                              swizzle="xor")
#: The dense HGEMM's 128 x 256 tile at a 128-deep K step for 2:4 sparse A (two ring stages
#: beside C's tile): the sm_90 default while the metadata words came from global memory
#: (``sparse_meta="global"``; on an H200 the best or within 3 % of it at each of the bench's
#: large shapes, 1.24-1.30x the dense HGEMM device only, ``docs/gemm.md``). With the words by
#: TMA it keeps two stages and one word slot, at the shared-memory limit.
WIDE_SPARSE_TILE = GemmConfig(block_k=128)
#: The sm_90 kernel's tile for 2:4 sparse A: 192 x 128 at a 128-deep K step, three ring
#: stages and two slots of metadata words by TMA (``sparse_meta="tma"``, the config's
#: default). On an H100 (``scripts/sparse_candidates.py``, twenty-eighth session, device only
#: against the dense HGEMM): 8192^3 1.47x, 4096^3 1.22x, 4096 x 14336 x 4096 1.35x, where the
#: wide tile read 1.24 / 1.19 / 1.19x with its words by TMA and 1.28 / 1.23 / 1.25x from
#: global memory.
SPARSE_WGMMA_CONFIG = GemmConfig(block_m=192, block_n=128, block_k=128)
#: How much faster the default tile turns out an output element than the wide tile with its
#: words from global memory, where both fill their waves (8192^3 on an H100: 1.47x against
#: 1.28x the dense HGEMM).
TALL_TILE_SPEEDUP = 1.15


def wgmma_tile_for(m: int, n: int, multiprocessors: int) -> GemmConfig:
    """The sm_90 tile of an ``m`` x ``n`` product: the default, unless the wide tile (its
    words from global memory) finishes first by its waves of persistent tiles, each wave's
    time its tile's elements (the default's divided by ``TALL_TILE_SPEEDUP``). At 2048^2 the
    default's 176 tiles make two waves on 132 SMs where the wide tile's 128 make one: 0.90x
    the dense HGEMM against 1.2x (H100, twenty-eighth session)."""
    def time(config: GemmConfig, speed: float) -> float:
        output_tiles = math.ceil(m / config.block_m) * math.ceil(n / config.block_n)
        waves = math.ceil(output_tiles / multiprocessors)
        return waves * config.block_m * config.block_n / speed

    wide = WIDE_SPARSE_TILE.replace(sparse_meta="global")
    if time(wide, 1.0) < time(SPARSE_WGMMA_CONFIG, TALL_TILE_SPEEDUP):
        return wide
    return SPARSE_WGMMA_CONFIG


_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Sparse24:
    """A 2:4 sparse matrix: ``values [M, K / 2]`` (the kept elements) and ``meta`` (int16
    ``[M, K / 16]``, their positions; module docstring), with ``K`` padded to a multiple of
    16; ``k`` is the logical column count. ``derived`` keeps forms made from them on first use
    (the sm_90 kernel's metadata words, ``wgmma_words``), so its tensors are not to be changed
    in place (compress the new matrix instead)."""

    values: torch.Tensor
    meta: torch.Tensor
    k: int
    derived: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        return self.values.shape[0], self.k

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device


def _groups(a: torch.Tensor) -> torch.Tensor:
    """``a [M, K]`` as ``[M, K' / 4, 4]``, K padded with zeros to a multiple of 16."""
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        raise ValueError(f"a must be a 2-D torch.Tensor, got "
                         f"{tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__}")
    pad = -a.shape[1] % META_COLUMNS
    return F.pad(a, (0, pad)).reshape(a.shape[0], -1, 4)


def prune_2_4(a: torch.Tensor) -> torch.Tensor:
    """``a`` with the two smallest magnitudes of every group of four columns set to zero (a
    trailing group of fewer than four keeps its two largest)."""
    groups = _groups(a)
    keep = groups.abs().topk(2, dim=-1).indices
    pruned = torch.zeros_like(groups).scatter_(-1, keep, groups.gather(-1, keep))
    return pruned.reshape(a.shape[0], -1)[:, :a.shape[1]]


def compress_2_4(a: torch.Tensor) -> Sparse24:
    """The ``Sparse24`` form of a 2:4 sparse fp16/bf16 ``a [M, K]``.

    Raises:
        TypeError: a dtype other than fp16/bf16.
        ValueError: not a matrix, or a group of four columns with more than two non-zeros
            (``prune_2_4`` makes one that has none).
    """
    groups = _groups(a)
    if a.dtype not in _DTYPES:
        raise TypeError(f"2:4 sparse A is fp16 or bf16, got {a.dtype}")
    nonzero = groups != 0
    crowded = nonzero.sum(dim=-1) > 2
    if crowded.any():
        row, group = (int(x) for x in crowded.nonzero()[0])
        raise ValueError(f"a is not 2:4 sparse: row {row}, columns {4 * group}..{4 * group + 3} "
                         f"hold more than two non-zeros (prune_2_4 keeps the two largest)")
    # Non-zero positions first, then free ones, each in column order; the two kept in order.
    order = torch.where(nonzero, 0, 4) + torch.arange(4, device=a.device)
    kept = order.argsort(dim=-1)[..., :2].sort(dim=-1).values
    values = groups.gather(-1, kept).reshape(a.shape[0], -1)
    fields = (kept[..., 0] | kept[..., 1] << 2).to(torch.int32).reshape(a.shape[0], -1, 4)
    words = (fields << torch.arange(0, 16, 4, device=a.device, dtype=torch.int32)).sum(-1)
    # Two's complement: the int16 holds the word's 16 bits.
    meta = torch.where(words >= 1 << 15, words - (1 << 16), words).to(torch.int16)
    return Sparse24(values.contiguous(), meta.contiguous(), a.shape[1])


def wgmma_words(s: Sparse24) -> torch.Tensor:
    """``s.meta`` as the sm_90 kernel's threads read it: int32 ``[M' / 16, ceil(K / 128), 16,
    4]``, element ``[b, g, 2 r + h, t]`` the word thread pair ``(r, h)`` hands the sparse
    ``wgmma`` for 32-deep step ``t`` of K group ``g`` in row block ``b``: metadata column
    ``8 g + 2 t + h`` of rows ``16 b + r`` (low half) and ``16 b + r + 8`` (high half),
    ``PAD_META`` past M and K; M' is M rounded up to ``WORDS_ROWS``, so that every tile's
    TMA box of words (``GemmConfig.sparse_meta="tma"``) lies inside the tensor. One 16-byte
    load a thread per 128 columns, where reading ``meta`` in place takes eight 2-byte loads
    across eight rows. Made once per ``Sparse24`` (``derived``)."""
    words = s.derived.get("wgmma")
    if words is None:
        rows, cols = s.meta.shape
        blocks = -(-rows // WORDS_ROWS) * WORDS_ROWS // 16
        groups = -(-cols * META_COLUMNS // WORDS_K)
        per_group = WORDS_K // META_COLUMNS
        meta = F.pad(s.meta.to(torch.int32) & 0xFFFF,
                     (0, groups * per_group - cols, 0, blocks * 16 - rows), value=PAD_META)
        # rows (block, half, r), columns (group, step, h) -> [block, group, r, h, step]
        meta = meta.view(blocks, 2, 8, groups, per_group // 2, 2)
        words = (meta[:, 0] | meta[:, 1] << 16).permute(0, 2, 1, 4, 3)
        words = words.reshape(blocks, groups, 16, per_group // 2).contiguous()
        s.derived["wgmma"] = words
    return words


def decompress(s: Sparse24) -> torch.Tensor:
    """The dense ``[M, K]`` matrix of ``s``."""
    m = s.values.shape[0]
    words = s.meta.to(torch.int32) & 0xFFFF
    fields = (words[..., None] >> torch.arange(0, 16, 4, device=s.device)) & 0xF
    kept = torch.stack((fields & 3, fields >> 2), dim=-1).reshape(m, -1, 2).long()
    groups = torch.zeros((m, kept.shape[1], 4), dtype=s.dtype, device=s.device)
    groups.scatter_(-1, kept, s.values.reshape(m, -1, 2))
    return groups.reshape(m, -1)[:, :s.k]


def sparse_matmul(a: Sparse24, b: torch.Tensor, *,
                  config: GemmConfig | MmaGemmConfig | None = None) -> torch.Tensor:
    """``A @ b`` for a 2:4 sparse ``A`` (``compress_2_4``), fp32 accumulation, in A's dtype.

    On sm_90 the ``wgmma`` kernel (``kernels/gemm/sm90.py``, ``wgmma.mma_async.sp``) takes
    ``b`` as it is where the TMA unit can read it (one unit-stride mode, the other's stride and
    ``N`` multiples of 16 bytes); elsewhere, or with an ``MmaGemmConfig``, the ``mma.sync``
    kernel (``mma.sp``) takes copies padded to whole tiles.

    Args:
        a: ``Sparse24`` of ``[M, K]`` on an sm80+ GPU.
        b: ``[K, N]`` in A's dtype and device.
        config: a ``GemmConfig`` (the sm_90 kernel's tile, ``block_k`` 64 or 128; default
            ``wgmma_tile_for`` the shape: ``SPARSE_WGMMA_CONFIG`` or the wide tile) or an
            ``MmaGemmConfig`` (the ``mma.sync`` tile: ``block_k`` 64, tiles in shared memory
            by ``cp.async`` and ``ldmatrix``; default ``SPARSE_CONFIG``).

    Returns:
        ``[M, N]``, contiguous.

    Raises:
        RuntimeError: an input requires grad (no backward pass).
        TypeError: ``a`` not a ``Sparse24``, ``b`` not a tensor, dtypes that differ.
        ValueError: shapes that do not multiply, tensors on other devices or not on a GPU, a
            ``GemmConfig`` for operands the TMA unit cannot read.
        ConfigError: a config the sparse kernel cannot build, a ``GemmConfig`` off sm_90.
    """
    if not isinstance(a, Sparse24):
        raise TypeError(f"a must be a Sparse24 (attnlab.gemm.sparse.compress_2_4), got "
                        f"{type(a).__name__}")
    refuse_autograd(a.values, b)
    check_b(b, "A", a.dtype, a.device, a.k)
    m, n = a.shape[0], b.shape[1]
    if m == 0 or n == 0 or a.k == 0:
        return torch.zeros((m, n), dtype=a.dtype, device=a.device)
    arch = arch_of(a.values, "sparse_matmul")
    dtype = str(a.dtype).removeprefix("torch.")
    if not isinstance(config, MmaGemmConfig):
        if arch not in GEMM_ARCHS:
            if config is not None:
                raise ConfigError(f"a GemmConfig is the sm_90 kernel's; this GPU is {arch}")
        else:
            key = (a.values.shape, a.values.stride(), a.dtype, a.device, a.k, b.shape,
                   b.stride(), config)
            call = _wgmma_calls.get(key)
            if call is None:
                call = _SparseWgmmaCall(a, b, config, arch, dtype)
                remember(_wgmma_calls, key, call)
            if call.takes(a, b):
                return call(a, b)
        config = None
    config = SPARSE_CONFIG if config is None else config
    spec = GemmSpec(config, arch, dtype, dtype, "k", "k", sparse=True)
    rows, k_tiles = tiles(m, config.block_m), tiles(a.meta.shape[1] * META_COLUMNS,
                                                   config.block_k)
    values = k_major(a.values, rows, k_tiles // 2)
    # The metadata is read 16 bits at a time: any unit-stride rows serve.
    meta = k_major(a.meta, rows, k_tiles // META_COLUMNS, value=PAD_META, align=2)
    b_t = k_major(b.t(), tiles(n, config.block_n), k_tiles)
    return run_tiles(spec, values, b_t, meta, m, n)


class _SparseWgmmaCall:
    """One call signature's product on the sm_90 kernel (spec and kernel made once), one
    persistent CTA per SM at most. Where the TMA unit cannot read ``b`` or write C in place, a
    call without a config goes to the ``mma.sync`` kernel (``takes`` is False) and one with a
    ``GemmConfig`` is refused."""

    def __init__(self, a: Sparse24, b: torch.Tensor, config: GemmConfig | None, arch: str,
                 dtype: str):
        m, n = a.shape[0], b.shape[1]
        self.strict = config is not None
        try:
            self.b_major, view = operand_major("b", b, ("k", "n"))
            # A view is rebuilt per call only where a size-1 mode's stride had to be replaced.
            self.restride = view is not b
            check_c_rows(n, dtype)
        except ValueError:
            if config is not None:
                raise
            self.b_major = None
            return
        sms = device.info(a.device).multiprocessors
        config = config or wgmma_tile_for(m, n, sms)
        spec = GemmSpec(config, arch, dtype, dtype, "k", self.b_major, sparse=True)
        self.fn = kernel_cache.get(spec).fn
        output_tiles = math.ceil(m / config.block_m) * math.ceil(n / config.block_n)
        self.num_ctas = min(output_tiles, sms)
        self.shape = (m, n)

    def takes(self, a: Sparse24, b: torch.Tensor) -> bool:
        """Whether this kernel runs the call (TMA-readable operands on 16-byte addresses)."""
        if self.b_major is None:
            return False
        if (a.values.data_ptr() | b.data_ptr()) % GEMM_ALIGN_BYTES:
            if self.strict:
                raise ValueError(f"the operands' data must start on {GEMM_ALIGN_BYTES}-byte "
                                 f"boundaries for the TMA unit; clone them")
            return False
        return True

    def __call__(self, a: Sparse24, b: torch.Tensor) -> torch.Tensor:
        if self.restride:
            _, b = operand_major("b", b, ("k", "n"))
        c = torch.empty(self.shape, dtype=a.dtype, device=a.device)
        self.fn(a.values, b, c, None, None, *NO_EPILOGUE[:4], wgmma_words(a), 1, self.num_ctas)
        return c


_wgmma_calls: dict[tuple, _SparseWgmmaCall] = {}


def forget() -> None:
    """Drop the sm_90 kernel's remembered call signatures (``gemm.api.forget_calls``)."""
    _wgmma_calls.clear()
