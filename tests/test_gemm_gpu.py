"""attnlab.gemm.matmul on the GPU (issue 22): against an fp64 product, at the lab's shapes,
adversarial ones (no tile multiples, K = 8, one row), both operand layouts, every split."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.gemm import GemmConfig, matmul

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: Relative Frobenius error of a correct product: the output's rounding (bf16 2^-9, fp16
#: 2^-12 on average) plus fp32 accumulation; a wrong tile or a missing K slice is O(1).
TOLERANCE = {torch.bfloat16: 8e-3, torch.float16: 1.5e-3, torch.float32: 2e-4}


def poison_allocator(numel: int) -> None:
    """Leave NaNs in the memory the next allocations get (the caching allocator hands a freed
    block back), so an output the kernel leaves unwritten fails the check."""
    junk = torch.full((numel,), float("nan"), device="cuda")
    del junk


def operands(m, n, k, dtype, a_major="k", b_major="n", seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
    if a_major == "m":
        a = a.t().contiguous().t()
    if b_major == "k":
        b = b.t().contiguous().t()
    return a, b


def check(c, a, b, out_dtype, what=""):
    ref = a.double() @ b.double()
    assert c.shape == ref.shape and c.dtype == out_dtype, what
    assert torch.isfinite(c).all(), f"{what}: non-finite output"
    err = ((c.double() - ref).norm() / ref.norm()).item()
    assert err < TOLERANCE[out_dtype], f"{what}: relative error {err:.2e}"


@pytest.mark.medium_memory
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (1024, 1024, 1024), (512, 512, 4096),
                                   (256, 256, 8192), (128, 128, 8192), (1, 4096, 4096),
                                   (16, 14336, 4096)])
def test_lab_shapes_with_the_default_dispatch(shape, dtype):
    a, b = operands(*shape, dtype)
    poison_allocator(3 * shape[0] * shape[1] * 16)
    check(matmul(a, b), a, b, dtype, str(shape))


@pytest.mark.parametrize("a_major", ["k", "m"])
@pytest.mark.parametrize("b_major", ["n", "k"])
@pytest.mark.parametrize("shape", [(333, 520, 1032), (129, 136, 72), (300, 264, 8),
                                   (1, 8, 8), (1000, 1000, 1000), (136, 200, 520)])
def test_operand_layouts_and_ragged_shapes(shape, a_major, b_major):
    a, b = operands(*shape, torch.bfloat16, a_major, b_major, seed=1)
    if a_major == "m" and shape[0] % 8 and shape[0] > 1:
        # A column-major A's column stride is M: the TMA unit needs 16-byte strides.
        with pytest.raises(ValueError, match="multiple of 8 elements"):
            matmul(a, b)
        return
    poison_allocator(3 * shape[0] * shape[1] * 16)
    check(matmul(a, b), a, b, torch.bfloat16, f"{shape} {a_major}{b_major}")


@pytest.mark.parametrize("mode", ["serial", "workspace", "atomic"])
@pytest.mark.parametrize("splits", [2, 3, 7])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_split_k_modes(mode, splits, out_dtype):
    a, b = operands(200, 392, 1000, torch.bfloat16, seed=2)
    cfg = GemmConfig(block_n=128, split_k=splits, split_mode=mode)
    poison_allocator(200 * 392 * 8 * 8)
    check(matmul(a, b, config=cfg, out_dtype=out_dtype), a, b, out_dtype, f"{mode} {splits}")


@pytest.mark.parametrize("tile_splits", [(64, 64, 2), (64, 64, 4), (64, 64, 8), (64, 128, 4),
                                         (128, 128, 2), (128, 128, 8)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cluster_split_k(tile_splits, out_dtype):
    """Slices meeting in a cluster, on ragged M, N and K (a partial last tile and K tile),
    deterministic run to run."""
    block_m, block_n, splits = tile_splits
    dtype = torch.float16 if out_dtype == torch.float16 else torch.bfloat16
    a, b = operands(200, 392, 1000, dtype, seed=5)
    cfg = GemmConfig(block_m=block_m, block_n=block_n, split_k=splits, split_mode="cluster")
    poison_allocator(200 * 392 * 8 * 8)
    first = matmul(a, b, config=cfg, out_dtype=out_dtype)
    check(first, a, b, out_dtype, f"cluster {cfg.label()}")
    assert torch.equal(matmul(a, b, config=cfg, out_dtype=out_dtype), first)


@pytest.mark.parametrize("cfg", [GemmConfig(block_m=64, block_n=64, block_k=32, stages=3),
                                 GemmConfig(block_m=192, block_n=128),
                                 GemmConfig(block_n=128, block_k=128, stages=3,
                                            raster_group=1, persistent=False)],
                         ids=["64x64x32", "192x128", "128x128x128-grid"])
def test_tile_configs(cfg):
    a, b = operands(700, 776, 1576, torch.float16, seed=3)
    check(matmul(a, b, config=cfg), a, b, torch.float16, cfg.label())


@pytest.mark.parametrize("cfg", [None, GemmConfig(block_m=64, block_n=64, split_k=2,
                                                   split_mode="serial")],
                         ids=["default", "serial2"])
def test_back_to_back_calls_each_read_the_previous_output(cfg):
    """Programmatic dependent launch (``GemmConfig.pdl``): each call launches while the one
    before may still run, so each reads its input only after that call has written it (a
    chain of dependent products, queued without a synchronisation), and an output reuses a
    buffer the previous call was still reading (the caching allocator's stream order)."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    weights = [torch.randn(512, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
               / 512 ** 0.5 for _ in range(6)]
    x = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
    ref = x.double()
    poison_allocator(384 * 512)
    torch.cuda.synchronize()
    for w in weights:
        x = matmul(x, w, config=cfg)
        ref = (ref @ w.double()).to(torch.bfloat16).double()
    err = ((x.double() - ref).norm() / ref.norm()).item()
    assert torch.isfinite(x).all() and err < 2 * TOLERANCE[torch.bfloat16], err


def test_captured_chain_replays_with_fresh_inputs():
    """Two dependent products captured in a CUDA graph (their PDL launches become the graph's
    programmatic edges) replay on new inputs as eager calls compute them."""
    gen = torch.Generator(device="cuda").manual_seed(12)
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
    w1, w2 = (torch.randn(512, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
              / 512 ** 0.5 for _ in range(2))
    matmul(matmul(x, w1), w2)  # the call signatures built before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = matmul(matmul(x, w1), w2)
    for seed in (1, 2):
        x.copy_(torch.randn(x.shape, device="cuda", generator=gen.manual_seed(seed)))
        y.fill_(float("nan"))
        graph.replay()
        want = matmul(matmul(x, w1), w2)
        torch.cuda.synchronize()
        assert torch.isfinite(y).all() and torch.equal(y, want)


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 700), n8=st.integers(1, 90), k8=st.integers(1, 200),
       b_major=st.sampled_from(["n", "k"]))
def test_random_shapes(m, n8, k8, b_major):
    a, b = operands(m, 8 * n8, 8 * k8, torch.bfloat16, b_major=b_major, seed=m)
    check(matmul(a, b), a, b, torch.bfloat16, f"{m}x{8 * n8}x{8 * k8} {b_major}")


def test_refuses_misaligned_operands():
    a, b = operands(64, 64, 72, torch.bfloat16)
    shifted = a.flatten()[1: 1 + 64 * 64].view(64, 64)  # 2 bytes past a 16-byte boundary
    with pytest.raises(ValueError, match="16-byte boundary"):
        matmul(shifted, b[:64])
    odd_rows = a[:, :71].contiguous()  # rows of 142 bytes
    with pytest.raises(ValueError, match="multiple of 8 elements"):
        matmul(odd_rows, b[:71])


def test_serial_split_k_is_deterministic_and_leaves_counters_zero():
    from attnlab.counters import _counters

    a, b = operands(192, 264, 4096, torch.bfloat16, seed=4)
    cfg = GemmConfig(block_m=64, block_n=128, split_k=8, split_mode="serial")
    first = matmul(a, b, config=cfg)
    check(first, a, b, torch.bfloat16, "serial")
    for _ in range(5):
        assert torch.equal(matmul(a, b, config=cfg), first)
    torch.cuda.synchronize()
    assert all(int(c.abs().sum()) == 0 for c in _counters.values())


@pytest.mark.parametrize("mode", ["serial", "workspace"])
def test_split_k_partials_kept_between_calls_serve_each_call(mode):
    """A call signature's split-K partials are kept per stream: calls on new operands, back
    to back without a sync, each give their own product (on a side stream too)."""
    cfg = GemmConfig(block_n=128, split_k=4, split_mode=mode)
    pairs = [operands(200, 392, 1000, torch.bfloat16, seed=s) for s in (5, 6, 7)]
    outs = [matmul(a, b, config=cfg) for a, b in pairs]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs.append(matmul(*pairs[0], config=cfg))
    torch.cuda.current_stream().wait_stream(side)
    for (a, b), out in zip(pairs + pairs[:1], outs, strict=True):
        check(out, a, b, torch.bfloat16, mode)


# ---- INT8 ------------------------------------------------------------------------------------
def int8_reference(a_q, b_q, scale_a, scale_b, zero_b):
    b = b_q.double() - (0 if zero_b is None else zero_b.double()[None, :])
    return (scale_a.double()[:, None] * a_q.double()) @ (b * scale_b.double()[None, :])


@pytest.mark.parametrize("zero_points", [True, False], ids=["asymmetric", "symmetric"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (333, 520, 1040), (1, 264, 128),
                                   (16, 4096, 4096), (200, 136, 16)])
def test_int8_matmul_dequantizes_in_the_epilogue(shape, out_dtype, zero_points):
    from attnlab.bench.gemm import int8_operands
    from attnlab.gemm import int8_matmul

    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(m + n)
    a_q, b_q, scale_a, scale_b, zero_b = int8_operands(m, n, k, gen)
    zero_b = zero_b if zero_points else None
    poison_allocator(3 * m * n * 8)
    out = int8_matmul(a_q, b_q, scale_a, scale_b, zero_b=zero_b, out_dtype=out_dtype)
    ref = int8_reference(a_q, b_q, scale_a, scale_b, zero_b)
    assert out.dtype == out_dtype and torch.isfinite(out).all()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < TOLERANCE[out_dtype], f"{shape}: relative error {err:.2e}"


@pytest.mark.parametrize("block_k", [32, 64, 128])
def test_int8_zero_points_sum_a_at_every_k_step(block_k):
    """The kernel sums A's rows for the zero points from the K tiles it multiplies: a quarter
    of a row's bytes per lane (8 bytes at ``block_k`` 32, 16 or 32 above), K off the tile,
    rows off the tile; A biased positive so a missed quarter moves the result by far more
    than the tolerance."""
    from attnlab.bench.gemm import int8_operands
    from attnlab.gemm import GemmConfig, int8_matmul

    m, n, k = 333, 264, 1008  # K: a multiple of 16 bytes, a tail at every K step
    gen = torch.Generator(device="cuda").manual_seed(block_k)
    a_q, b_q, scale_a, scale_b, zero_b = int8_operands(m, n, k, gen)
    a_q = (a_q.abs() // 2).to(torch.int8)
    poison_allocator(3 * m * n * 8)
    out = int8_matmul(a_q, b_q, scale_a, scale_b, zero_b=zero_b, out_dtype=torch.float32,
                      config=GemmConfig(block_m=128, block_n=128, block_k=block_k))
    ref = int8_reference(a_q, b_q, scale_a, scale_b, zero_b)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert torch.isfinite(out).all() and err < TOLERANCE[torch.float32], err


def test_int8_matmul_refuses_what_it_cannot_read():
    from attnlab.bench.gemm import int8_operands
    from attnlab.gemm import int8_matmul

    gen = torch.Generator(device="cuda").manual_seed(0)
    a_q, b_q, scale_a, scale_b, _ = int8_operands(64, 64, 128, gen)
    with pytest.raises(ValueError, match="K contiguous"):
        int8_matmul(a_q, b_q.contiguous(), scale_a, scale_b)
    with pytest.raises(ValueError, match="float32 vector of 64"):
        int8_matmul(a_q, b_q, scale_a[:32], scale_b)
    with pytest.raises(TypeError, match="int8"):
        int8_matmul(a_q.float(), b_q, scale_a, scale_b)


# ---- the mma.sync ladder ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["g01", "g02", "g03", "g04", "g05", "g06", "g07", "g07x",
                                  "g08", "g09"])
def test_ladder_steps_multiply(name):
    from attnlab.gemm.ladder import GEMM_STEPS, ladder_matmul

    a, b = operands(512, 512, 256, torch.bfloat16, b_major="k", seed=5)
    poison_allocator(512 * 512 * 8)
    check(ladder_matmul(a, b, GEMM_STEPS[name][0]), a, b, torch.bfloat16, name)


def test_ladder_kernel_refuses_partial_tiles():
    from attnlab.gemm.ladder import GEMM_STEPS, ladder_matmul

    a, b = operands(500, 512, 256, torch.float16, b_major="k")
    with pytest.raises(ValueError, match="whole tiles"):
        ladder_matmul(a, b, GEMM_STEPS["g05"][0])


@pytest.mark.parametrize("kernel", ["wgmma_n", "wgmma_k", "wgmma_k64", "wgmma_192",
                                    "wgmma_global", "wgmma_k64_global", "mma_sync"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", [(128, 128, 64), (256, 384, 512), (333, 200, 136),
                                   (1, 128, 40), (2048, 2048, 2048), (700, 520, 1016)])
def test_sparse_24_matches_the_dense_product_of_its_kept_values(shape, dtype, kernel):
    """``sparse_matmul``: the sm_90 ``wgmma.mma_async.sp`` kernel (B N-major or K-major, the
    default 128-deep K step or a 64-deep one, a 192-row tile; TMA tails; the metadata words
    by TMA, the default, or by each thread's global loads, ``sparse_meta="global"``) and the
    ``mma.sp`` one (padded tiles) on whole tiles, partial ones (M, N, K off the tile, one
    row, K not a multiple of 16) and groups with fewer than two non-zeros (a third of A's
    small values zeroed before pruning), against the fp64 product of the decompressed A."""
    from attnlab.gemm import GemmConfig, compress_2_4, prune_2_4, sparse_matmul
    from attnlab.gemm.sparse import SPARSE_CONFIG, decompress

    m, n, k = shape
    config = {"mma_sync": SPARSE_CONFIG, "wgmma_k64": GemmConfig(block_k=64),
              "wgmma_192": GemmConfig(block_m=192, block_n=128, block_k=128),
              "wgmma_global": GemmConfig(block_k=128, sparse_meta="global"),
              "wgmma_k64_global": GemmConfig(block_k=64, sparse_meta="global")}.get(kernel)
    a, b = operands(m, n, k, dtype, b_major="n" if kernel == "wgmma_n" else "k",
                    seed=m + n + k)
    a = torch.where(a.abs() < 0.4, 0, a)
    s = compress_2_4(prune_2_4(a))
    poison_allocator(2 * (m + 128) * (n + 128))
    check(sparse_matmul(s, b, config=config), decompress(s), b, dtype, str(shape))


@pytest.mark.medium_memory
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", [(128, 128, 64), (256, 384, 1024), (333, 200, 136),
                                   (1, 128, 40), (2048, 2048, 2048)])
def test_online_int8_matches_its_torch_reference(shape, dtype):
    """``online_int8_matmul``: whole and padded tiles (M, N, K off the tile, one row, K not a
    multiple of 64), rows with outliers, against ``online_int8_reference`` (the same per-tile
    quantization in fp64: a wrong scale, row or tile is O(1) off), and within 3 % of the exact
    product (the method's own error with these outliers: 1.9 %, ``docs/gemm.md``)."""
    from attnlab.gemm import online_int8_matmul
    from attnlab.gemm.online import online_int8_reference

    m, n, k = shape
    a, b = operands(m, n, k, dtype, seed=m + 2 * n + k)
    a[:, ::97] *= 50
    poison_allocator(2 * (m + 128) * (n + 128))
    c = online_int8_matmul(a, b)
    check(c, online_int8_reference(a, b), torch.eye(n, dtype=torch.float64, device="cuda"),
          dtype, f"{shape} against the reference")
    exact = a.double() @ b.double()
    assert ((c.double() - exact).norm() / exact.norm()).item() < 0.03, shape
