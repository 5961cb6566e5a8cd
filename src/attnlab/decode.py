"""Decoding against a KV cache: ``attention_with_kvcache`` (flash_attn's
``flash_attn_with_kvcache``), split-KV over contiguous or paged caches.

A call appends the new keys and values (``k``, ``v``) to the cache at ``cache_seqlens`` in
place, then attends ``q`` to each sequence's cache. The kernel (``kernels/common/decode.py``)
packs the query heads of a K/V head into the rows of one tile (pack-GQA) and, when the grid of
(query tile, sequence, K/V head) would leave SMs idle, splits every sequence's K/V range over
``num_splits`` CTAs whose partial outputs are merged by their LSEs: by the split that finishes
a query tile last where the walks are short (``serial_merge``: one launch per call), else by a
second kernel (``kernels/common/decode_combine.py``). The kernels are built once per call
signature; a call then allocates its outputs and launches, nothing that reads device memory
from the host, so a decoding step with fixed shapes can be captured in a CUDA graph.

Trusted inputs: ``cache_seqlens`` must not run past the cache (or, paged, past the pages of
``block_table``), and ``block_table`` must name existing pages. Reading them would cost a
device-to-host copy per call; ``check_cache=True`` does it and refuses what is out of range.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from attnlab import device, kernel_cache
from attnlab.config import SMEM_CAPACITY, ConfigError
from attnlab.kernels.abi import (
    DECODE_WARPS,
    UNBOUNDED_SIDE,
    CombineSpec,
    DecodeSpec,
    encode_window,
)
from attnlab.memo import remember
from attnlab.validation import check_kvcache_inputs, check_kvcache_values, wants_grad

#: Largest split count the call picks itself (``num_splits=0``; up to 128 may be asked for;
#: a paged cache on a GPU whose DRAM outruns half its SMs' paged CTAs: ``PAGED_WAVE_SPLITS``).
#: Each split's partial output is a [B, Sq, Hq, D] fp32 tensor, and every partial is read
#: again to merge: where one tile's walk is split 128 ways (B = 1 MQA from 32k keys), 64
#: splits read 1 x 32k 19 % and 1 x 128k 9 % faster on an H100, device only (thirty-fourth
#: session, docs/decode.md).
MAX_SPLITS = 64
#: A split call merges serially (``serial_merge``) up to this many splits (more: the combine
#: kernel's CTAs merge the rows side by side, one merging CTA would take longer)...
SERIAL_MERGE_SPLITS = 32
#: ... of up to this many K/V blocks each (longer walks: the combine kernel, see
#: ``serial_merge``).
SERIAL_MERGE_BLOCKS = 4
#: CTAs per SM the split count aims at: one (measured: 16 splits of B=1 x 32k read 2,269
#: GB/s, 33 splits 1,809, 64 splits 1,460; docs/decode.md).
CTAS_PER_SM = 1
#: A grid that fills half the GPU or more (two splits would fill it) keeps a contiguous
#: cache's K/V range whole up to this many K/V blocks: at 4k keys (32 blocks of 128) one split
#: read 2.8-4.4 % (H100) and 0.3-1.3 % (H200) faster on the device and 1.5-5.9 % end to end,
#: the partials and the combine's launch outweighing the second wave of streams; at 32k keys
#: two splits stay (even on the H100, +5 % on the H200). A paged cache's too, where the DRAM
#: brings each SM at most ``PAGED_WHOLE_DRAM_PER_SM`` (thirty-fifth and fortieth sessions,
#: docs/decode.md).
UNSPLIT_HALF_WAVE_BLOCKS = 32
#: Nominal DRAM bytes a second per SM up to which a paged cache's short walk on half a wave
#: stays whole (``UNSPLIT_HALF_WAVE_BLOCKS``). A paged CTA streams less than a contiguous one
#: (its per-row page lookups), so where the DRAM outruns half the SMs' CTAs the second wave
#: wins: an H100 SXM (25 GB/s an SM) read 64 x 4k MQA and 8 x 4k GQA 2-3 % faster unsplit, an
#: H200 (36 GB/s an SM) 9-13 % faster in two splits (fortieth session).
PAGED_WHOLE_DRAM_PER_SM = 30e9
#: Above that DRAM rate, a paged cache's grid that ``MAX_SPLITS`` leaves at half a wave or
#: less (B = 1 MQA: one K/V range) fills the whole wave, up to this many splits, while each
#: still walks ``PAGED_WAVE_SPLIT_BLOCKS`` blocks: 64 paged CTAs on half the SMs stream below
#: the DRAM's rate, where 64 contiguous ones tie with 128. On an H200, 128 splits read 1 x 64k /
#: 96k / 128k MQA paged 3.4 / 7.5 / 9.3-10.1 % faster device only than 64, and 1 x 32k (two
#: blocks a split) 6.8 % slower (fifty-sixth session, docs/decode.md).
PAGED_WAVE_SPLITS = 128
PAGED_WAVE_SPLIT_BLOCKS = 4
#: K/V blocks a split walks at least: B = 1 x 4k MQA (32 blocks) read 9 % (H100) and 5 %
#: (H200) faster on the device in 16 splits of two blocks than in 32 of one, each split's
#: partial and its share of the merge costing about as much as a block's load.
MIN_SPLIT_BLOCKS = 2
#: Splits merged in a cluster of their CTAs (``cluster_merge``) instead of by the serial merge
#: or the combine kernel, where the clusters run side by side: two splits on a grid of up to
#: one wave, up to ``CLUSTER_MERGE_SPLITS`` on up to half a wave. On an H200 (fifty-sixth
#: session, docs/decode.md), device only: two splits +1.2 % (8 x 32k GQA), +2.5 / +4.7 % paged
#: (8 x 4k GQA, 64 x 4k MQA), eight at half a wave +13 % (8 x 4k MQA against the serial merge),
#: four there even; but clusters of 4-16 on a whole wave (128 CTAs) ran 23-31 % slower: not
#: all of them fit the GPU's GPCs at once.
CLUSTER_MERGE = True
#: The most splits merged in a cluster: 8, the portable cluster size (16 needs an opt-in that
#: not every sm_90 part schedules).
CLUSTER_MERGE_SPLITS = 8
#: K/V by the TMA unit on sm_90a (``kernels/common/decode_tma.py``), where the cache's pages
#: allow (``tma_rows``). Off: against the ``cp.async`` gathers the boxes read a contiguous
#: cache 2-9 % slower and a paged one within -2 to +0.4 % (H100, thirty-seventh session,
#: ``scripts/decode_candidates.py --tma``, docs/decode.md).
TMA_KV_LOADS = False

_calls: dict[tuple, _DecodeCall] = {}


def decode_tile(head_dim: int, arch: str) -> tuple[int, int]:
    """``(keys_per_warp, kv_stages)`` of the decoding kernel: a K/V block of 128 keys where
    shared memory holds two (hd <= 128 on sm_80/90), else of 64; three blocks in flight where
    they fit, else two (measured at hd128 on an H200: +1 to +7 % from the third stage,
    ``docs/decode.md``).

    Raises:
        attnlab.ConfigError: no block fits ``arch``'s shared memory at this head dim.
    """
    capacity = SMEM_CAPACITY.get(arch, min(SMEM_CAPACITY.values()))
    for keys_per_warp in (32, 16):
        if head_dim > 128 and keys_per_warp == 32:
            # 64-key blocks at hd192/256 (48-64 KiB of K and V each) fit sm_80 twice too;
            # 128-key ones were not measured there.
            continue
        block = keys_per_warp * DECODE_WARPS
        for stages in (3, 2):
            need = 2 * stages * block * head_dim * 2 + 16 * head_dim * 2 + 2048
            if need <= capacity:
                return keys_per_warp, stages
    raise ConfigError(f"no decoding tile at head_dim={head_dim} fits the shared memory of "
                      f"{arch} ({capacity} bytes)")


def tma_rows(arch: str, block_n: int, page_size: int | None,
             enabled: bool | None = None) -> int:
    """Keys per TMA box of a call's K/V blocks (``DecodeSpec.tma_rows``), 0 for ``cp.async``
    gathers: where ``enabled`` (None: ``TMA_KV_LOADS``) on sm_90a, a whole block for a
    contiguous cache (``page_size`` None), a page where pages are a whole fraction of a block,
    the block where a page holds whole blocks; other page sizes (e.g. 48 keys, pages
    straddling blocks) keep the gathers. A box's rows start on a swizzle atom (8 rows)."""
    if not (TMA_KV_LOADS if enabled is None else enabled) or arch != "sm_90a":
        return 0
    if page_size is None or page_size % block_n == 0:
        return block_n
    return page_size if block_n % page_size == 0 and page_size % 8 == 0 else 0


def choose_splits(ctas: int, kv_blocks: int, multiprocessors: int, paged: bool = False,
                  dram_bytes_per_s: float = 0.0) -> int:
    """Splits per K/V range so that up to ``CTAS_PER_SM`` CTAs per SM run in one wave: none
    when the (query tile, sequence, K/V head) grid already fills the GPU, and none for a short
    walk on a grid of half a wave or more (``UNSPLIT_HALF_WAVE_BLOCKS``; a ``paged`` one only
    where ``dram_bytes_per_s``, the device's, is at most ``PAGED_WHOLE_DRAM_PER_SM`` an SM);
    at least ``MIN_SPLIT_BLOCKS`` K/V blocks a split, at most ``MAX_SPLITS`` (a paged cache
    above that DRAM rate whose grid would fill half a wave at most: up to
    ``PAGED_WAVE_SPLITS`` of ``PAGED_WAVE_SPLIT_BLOCKS`` blocks).
    Rounded down: 17 splits of 8 CTAs are 136 CTAs on 132 SMs, a second wave of 4 that
    doubles the time."""
    if ctas <= 0 or ctas >= multiprocessors:
        return 1
    wanted = CTAS_PER_SM * multiprocessors // ctas
    fast_paged = paged and dram_bytes_per_s > PAGED_WHOLE_DRAM_PER_SM * multiprocessors
    if wanted == 2 and kv_blocks <= UNSPLIT_HALF_WAVE_BLOCKS and not fast_paged:
        return 1
    splits = min(wanted, kv_blocks // MIN_SPLIT_BLOCKS, MAX_SPLITS)
    if fast_paged and 2 * splits * ctas <= CTAS_PER_SM * multiprocessors:
        splits = max(splits, min(wanted, kv_blocks // PAGED_WAVE_SPLIT_BLOCKS,
                                 PAGED_WAVE_SPLITS))
    return max(1, splits)


def serial_merge(splits: int, kv_blocks: int) -> bool:
    """Whether a call of ``splits`` splits over ``kv_blocks`` K/V blocks merges them in the
    decoding kernel (its last split per tile) instead of in a second kernel. A short walk's
    call is bound by its host side, where the combine's launch is 4.4-5 us of about 20 (an
    H200's host, docs/decode.md); a long walk's by the device, where the serial merge's tail
    (a count at the tile's counter, then one CTA reading every partial) costs more than the
    combine launched behind the decoding (PDL): -3 % at B = 8 x 32k MQA (16 splits of 16
    blocks), -12 % at 1 x 128k MQA (128 splits). Even a short walk's serial merge takes
    longer on the device (up to 14 %, B = 1 x 4k MQA), so a call captured in a CUDA graph,
    which replays without its host side, takes the combine kernel."""
    return 1 < splits <= SERIAL_MERGE_SPLITS and math.ceil(
        kv_blocks / splits) <= SERIAL_MERGE_BLOCKS


def cluster_merge(splits: int, ctas: int, multiprocessors: int, arch: str,
                  enabled: bool | None = None) -> bool:
    """Whether ``splits`` splits of a grid of ``ctas`` (query tile, sequence, K/V head) CTAs
    merge in clusters (``DecodeSpec.cluster_splits``: a tile's splits are one cluster's CTAs,
    which merge in distributed shared memory): where ``enabled`` (None: ``CLUSTER_MERGE``), on
    sm_90a, two splits on up to a wave of CTAs or up to ``CLUSTER_MERGE_SPLITS`` on up to
    half a wave."""
    on = CLUSTER_MERGE if enabled is None else enabled
    wave = multiprocessors if splits == 2 else multiprocessors // 2
    return (on and arch == "sm_90a" and 1 < splits <= CLUSTER_MERGE_SPLITS
            and splits * ctas <= wave)


def attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    *,
    cache_seqlens: torch.Tensor | int | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    num_splits: int = 0,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    check_cache: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` over a KV cache, after appending ``k`` and ``v`` to it in place.

    Args:
        q: ``[B, Sq, Hq, D]``, fp16 or bf16, on CUDA.
        k_cache, v_cache: ``[B_cache, S_cache, Hkv, D]``, or with ``block_table`` a paged
            cache ``[num_pages, page_size, Hkv, D]`` (``page_size`` >= 16); ``Hq`` a multiple
            of ``Hkv`` (GQA/MQA).
        k, v: ``[B, S_new, Hkv, D]`` new keys and values, written into the cache at
            positions ``cache_seqlens[b] ..`` before attending; None: nothing appended.
        cache_seqlens: int32 ``[B]`` (or an int for all) keys already in each sequence's
            cache; None: the whole cache (``S_cache``, or ``block_table``'s pages).
        cache_batch_idx: int32 ``[B]``, the cache row of each sequence (contiguous caches);
            None: row ``b``.
        block_table: int32 ``[B, max_pages]``, the pages of each sequence in order.
        softmax_scale: multiplier of Q K^T; None is ``1 / sqrt(D)``.
        causal: query position ``i`` sees keys ``<= i + Sk - Sq`` (bottom-right aligned,
            ``Sk`` = cache_seqlens + S_new), flash_attn's convention.
        window_size: ``(left, right)`` band around that diagonal; -1 leaves a side open.
        num_splits: CTAs per K/V range; 0 picks from the problem and the SM count.
        return_lse: also return the natural-log LSE ``[B, Hq, Sq]`` (fp32).
        out: write the output here (q's shape and dtype).
        check_cache: read ``cache_seqlens`` and ``block_table`` on the host and refuse
            lengths past the cache and pages out of range (one device sync; off, they are
            trusted).

    Returns:
        ``out`` ``[B, Sq, Hq, D]``, or ``(out, lse)``. A row that sees no key gets 0 and LSE
        -inf.

    Raises:
        TypeError, ValueError: malformed inputs (shapes, dtypes, layouts, devices, options),
            with what was expected.
        RuntimeError: an input requires grad while grad mode is on (decoding has no backward).
        attnlab.ConfigError: no decoding tile fits this GPU at this head dim.
    """
    if wants_grad(q, k_cache, v_cache, k, v):
        # No backward for decoding: a result without a graph would make loss.backward() fail
        # far from here, or leave these inputs' gradients silently out.
        raise RuntimeError("attention_with_kvcache is not differentiable (inference only): "
                           "call it under torch.no_grad() / torch.inference_mode(), or with "
                           "inputs that do not require grad; for training use "
                           "attnlab.attention")
    if torch.compiler.is_compiling():
        return _traced(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table,
                       softmax_scale, causal, window_size, num_splits, return_lse, out)
    options = (softmax_scale, causal, window_size, num_splits)
    key, call = (None, None) if check_cache else _lookup(
        q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, out, options)
    if call is None:
        problem = check_kvcache_inputs(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens,
                                       cache_batch_idx=cache_batch_idx,
                                       block_table=block_table, softmax_scale=softmax_scale,
                                       causal=causal, window_size=window_size,
                                       num_splits=num_splits, out=out)
        call = _DecodeCall(q, k_cache, v_cache, k, block_table, cache_batch_idx is not None,
                           problem, num_splits)
        if key is not None:
            remember(_calls, key, call)
        if check_cache:
            seqlens = call.seqlens(cache_seqlens, q, k)
            check_kvcache_values(seqlens, k_cache, block_table,
                                 k.shape[1] if k is not None else 0, call.capacity)
    out, lse = call(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table,
                    out, return_lse)
    return (out, lse) if return_lse else out


def _traced(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table,
            softmax_scale, causal, window_size, num_splits, return_lse, out):
    """Under torch.compile: the custom op (validated here, at trace time, on fake tensors'
    metadata), an ``out`` filled by a copy."""
    scale, (left, right) = check_kvcache_inputs(
        q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
        block_table=block_table, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, num_splits=num_splits, out=out, check_pointers=False)
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32,
                                   device=q.device)
    result, lse = attention_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx,
                                    block_table, scale, left, right, num_splits)
    if out is not None:
        out.copy_(result)
        result = out
    return (result, lse) if return_lse else result


@torch.library.custom_op("attnlab::attention_kvcache", mutates_args=("k_cache", "v_cache"))
def attention_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      k: torch.Tensor | None, v: torch.Tensor | None,
                      cache_seqlens: torch.Tensor | None, cache_batch_idx: torch.Tensor | None,
                      block_table: torch.Tensor | None, softmax_scale: float, window_left: int,
                      window_right: int, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention_with_kvcache`` as a custom op (what a compiled graph records): the
    window as the kernels take it (``encode_window``); the caches are appended to."""
    window = tuple(-1 if side >= UNBOUNDED_SIDE else side for side in (window_left,
                                                                       window_right))
    return attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens,
                                  cache_batch_idx=cache_batch_idx, block_table=block_table,
                                  softmax_scale=softmax_scale, window_size=window,
                                  num_splits=num_splits, return_lse=True)


@attention_kvcache.register_fake
def _(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, softmax_scale,
      window_left, window_right, num_splits):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32))


def _meta(t: torch.Tensor) -> tuple:
    """What a call signature keeps of a tensor argument."""
    return (t.shape, t.stride(), t.dtype, t.device)


def _lookup(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, out,
            options) -> tuple[tuple | None, _DecodeCall | None]:
    """``(call signature, remembered call or None)``; ``(None, None)`` for arguments that
    cannot form a key (not tensors, unhashable options): their validation says what is wrong.
    The three tensors every call has are spelled out and the optional ones skipped when None:
    the key is built on every call of a host-bound path (0.4 us less a call than a ``_meta``
    per argument, measured on this project's CPU)."""
    try:
        key = (q.shape, q.stride(), q.dtype, q.device,
               k_cache.shape, k_cache.stride(), k_cache.dtype, k_cache.device,
               v_cache.shape, v_cache.stride(), v_cache.dtype, v_cache.device,
               None if k is None else _meta(k), None if v is None else _meta(v),
               cache_seqlens if isinstance(cache_seqlens, int) or cache_seqlens is None
               else _meta(cache_seqlens),
               None if cache_batch_idx is None else _meta(cache_batch_idx),
               None if block_table is None else _meta(block_table),
               None if out is None else _meta(out), options)
        return key, _calls.get(key)
    except (TypeError, AttributeError):
        return None, None


class _DecodeCall:
    """One call signature's decoding: its kernels (built once), split count and scalars;
    a call appends, allocates the outputs and launches."""

    def __init__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 k: torch.Tensor | None, block_table: torch.Tensor | None, batch_idx: bool,
                 problem: tuple, num_splits: int):
        info = device.info(q.device)
        batch, seqlen_q, heads_q, head_dim = q.shape
        heads_kv = k_cache.shape[2]
        paged = block_table is not None
        self.capacity = (block_table.shape[1] * k_cache.shape[1] if paged
                         else k_cache.shape[1])
        self.new_tokens = k.shape[1] if k is not None else 0
        keys_per_warp, stages = decode_tile(head_dim, info.arch)
        tiles = math.ceil(seqlen_q * (heads_q // heads_kv) / 16)
        kv_blocks = math.ceil(self.capacity / (keys_per_warp * DECODE_WARPS))
        self.splits = num_splits or choose_splits(tiles * batch * heads_kv, kv_blocks,
                                                  info.multiprocessors, paged,
                                                  info.dram_bytes_per_s)
        dtype = str(q.dtype).removeprefix("torch.")
        self.scale, (self.left, self.right) = problem
        windowed = (self.left, self.right) != encode_window((-1, -1))
        boxes = tma_rows(info.arch, keys_per_warp * DECODE_WARPS,
                         k_cache.shape[1] if paged else None)
        # The cluster merge is built on the row gathers only.
        self.cluster = not boxes and cluster_merge(self.splits, tiles * batch * heads_kv,
                                                   info.multiprocessors, info.arch)
        self.serial = not self.cluster and serial_merge(self.splits, kv_blocks)
        #: Counters of a serial merge: one per (query tile, sequence x K/V head).
        self.tiles = tiles * batch * heads_kv
        spec = DecodeSpec(info.arch, dtype, head_dim, paged, batch_idx, windowed,
                          self.splits > 1 and not self.cluster, keys_per_warp, stages,
                          v_cache.stride()[:2] != k_cache.stride()[:2], self.serial, boxes,
                          self.splits if self.cluster else 0)
        self.decode = kernel_cache.get(spec).fn
        self.combine = self.split_decode = None
        if self.splits > 1 and not self.cluster:
            # A call captured in a CUDA graph replays without its host side, so there the
            # combine kernel's shorter device time wins (``serial_merge``); both are built
            # here, as a capture may not load modules.
            self.split_decode = (kernel_cache.get(dataclasses.replace(
                spec, serial_merge=False)).fn if self.serial else self.decode)
            self.combine = kernel_cache.get(CombineSpec(info.arch, dtype, head_dim)).fn
        self._scratch: dict[int, tuple[torch.Tensor, ...]] = {}
        self._filled: tuple[int, torch.Tensor] | None = None

    def seqlens(self, cache_seqlens: torch.Tensor | int | None, q: torch.Tensor,
                k: torch.Tensor | None) -> torch.Tensor:
        """Keys in each sequence's cache before the append, as an int32 tensor."""
        if isinstance(cache_seqlens, torch.Tensor):
            return cache_seqlens
        filled = self.capacity - self.new_tokens if cache_seqlens is None else cache_seqlens
        # Kernels only read the lengths (an append adds to a copy), so the last filled
        # tensor serves every call with the same count: no fill kernel per decoding step.
        if self._filled is None or self._filled[0] != filled:
            self._filled = (filled, torch.full((q.shape[0],), filled, dtype=torch.int32,
                                               device=q.device))
        return self._filled[1]

    def scratch(self, q: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The split partials (O and LSE), an LSE nobody reads and a serial merge's zeroed
        counters, allocated once per stream (``device.per_stream``): the merge reads the
        partials before the call's last launch ends, and the kernel leaves the counters
        zero."""
        batch, seqlen_q, heads_q, head_dim = q.shape
        splits = self.splits if self.splits > 1 and not self.cluster else 0
        return device.per_stream(self._scratch, q.device, lambda: (
            *(torch.empty(shape, dtype=torch.float32, device=q.device) for shape in (
                (splits * batch, seqlen_q, heads_q, head_dim),
                (splits * batch, heads_q, seqlen_q), (batch, heads_q, seqlen_q))),
            torch.zeros(self.tiles if self.serial else 0, dtype=torch.int32,
                        device=q.device)))

    def __call__(self, q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table,
                 out, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
        batch, seqlen_q, heads_q, _ = q.shape
        seqlens = self.seqlens(cache_seqlens, q, k)
        if k is not None:
            _append(k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table)
            seqlens = seqlens + k.shape[1]
        if out is None:
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
        if not out.numel():
            return out, torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32,
                                    device=q.device)
        partial_out, partial_lse, lse, counters = self.scratch(q)
        if return_lse:
            lse = torch.empty_like(lse)
        if self.splits == 1 or self.cluster:
            self.decode(q, k_cache, v_cache, seqlens, cache_batch_idx, block_table, out, lse,
                        self.scale, self.left, self.right, self.splits, None, None, None)
        elif self.serial and not torch.cuda.is_current_stream_capturing():
            self.decode(q, k_cache, v_cache, seqlens, cache_batch_idx, block_table, partial_out,
                        partial_lse, self.scale, self.left, self.right, self.splits, out, lse,
                        counters)
        else:
            self.split_decode(q, k_cache, v_cache, seqlens, cache_batch_idx, block_table,
                              partial_out, partial_lse, self.scale, self.left, self.right,
                              self.splits, None, None, None)
            self.combine(partial_out, partial_lse, out, lse, self.splits)
        return out, lse


def _append(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            seqlens: torch.Tensor, cache_batch_idx: torch.Tensor | None,
            block_table: torch.Tensor | None) -> None:
    """Write k and v at positions ``seqlens[b] ..`` of each sequence's cache (device-side
    indices: no host sync, safe in a CUDA graph)."""
    positions = seqlens.long()[:, None] + torch.arange(k.shape[1], device=k.device)
    if block_table is not None:
        page_size = k_cache.shape[1]
        rows = (block_table.long().gather(1, positions // page_size), positions % page_size)
    else:
        batch = (cache_batch_idx.long() if cache_batch_idx is not None
                 else torch.arange(k.shape[0], device=k.device))
        rows = (batch[:, None].expand_as(positions), positions)
    k_cache.index_put_(rows, k)
    v_cache.index_put_(rows, v)
