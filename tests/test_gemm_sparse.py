"""2:4 structured-sparse A (``attnlab.gemm.sparse``, issue 22) without a GPU: the format (prune,
compress, decompress and their errors), the call's refusals, the spec's rules, and the kernel
cross-compiled for sm_80 and sm_90a (``mma.sp`` by inline PTX: CuTe DSL 4.8.1's sparse warp
atom does not build), and the sm_90a ``wgmma`` kernel's (``wgmma.mma_async.sp``, inline PTX on
the dense MMA's shared-memory descriptors)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.config import SMEM_CAPACITY, ConfigError
from attnlab.gemm import GemmConfig, Sparse24, compress_2_4, prune_2_4, sparse_matmul
from attnlab.gemm.sparse import (
    PAD_META,
    SPARSE_CONFIG,
    SPARSE_WGMMA_CONFIG,
    WIDE_SPARSE_TILE,
    decompress,
    wgmma_tile_for,
    wgmma_words,
)
from attnlab.gemm_config import BARRIER_BYTES, BLOCK_MS, MmaGemmConfig
from attnlab.kernels.gemm.abi import WORDS_ROWS, GemmSpec


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 130), dtype=st.sampled_from(["fp16", "bf16"]),
       seed=st.integers(0, 2**16))
def test_pruned_matrices_compress_and_come_back(m, k, dtype, seed):
    """``prune_2_4`` keeps the two largest magnitudes of each group of four (no group keeps
    more than two non-zeros, no kept value changes), and compressing then decompressing gives
    the pruned matrix back exactly, K padded to 16 in the stored form."""
    torch.manual_seed(seed)
    a = torch.randn(m, k, dtype={"fp16": torch.float16, "bf16": torch.bfloat16}[dtype])
    pruned = prune_2_4(a)
    assert pruned.shape == a.shape
    groups = torch.nn.functional.pad(pruned, (0, -k % 4)).reshape(m, -1, 4)
    assert ((groups != 0).sum(-1) <= 2).all()
    assert torch.equal(pruned[pruned != 0], a[pruned != 0])
    s = compress_2_4(pruned)
    assert s.shape == (m, k) and s.values.shape == (m, (k + 15) // 16 * 8)
    assert s.meta.shape == (m, (k + 15) // 16) and s.meta.dtype == torch.int16
    assert torch.equal(decompress(s), pruned)


def test_metadata_fields_are_the_kept_positions_in_order():
    """Group g of a row is field g % 4 of word g // 4: the first kept position in its low two
    bits, the second in its high two; a group with fewer than two non-zeros keeps the first
    free positions (distinct, in order), which the padding word does everywhere."""
    a = torch.zeros(2, 32, dtype=torch.float16)
    a[0, 1], a[0, 6], a[0, 7] = 1, 2, 3         # groups 0: {1}, 1: {2, 3}
    a[1, 16], a[1, 19] = 4, 5                   # group 4: {0, 3}
    s = compress_2_4(a)
    words = s.meta.to(torch.int32) & 0xFFFF
    assert words.tolist() == [[0x44E4, 0x4444], [0x4444, 0x444C]]
    assert s.values[0, :4].tolist() == [0, 1, 2, 3] and s.values[1, 8:10].tolist() == [4, 5]
    assert PAD_META == 0x4444


def test_compress_refuses_what_is_not_2_4():
    with pytest.raises(ValueError, match=r"row 1, columns 4..7 hold more than two"):
        compress_2_4(torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 0]],
                                  dtype=torch.float16))
    with pytest.raises(TypeError, match="fp16 or bf16"):
        compress_2_4(torch.zeros(4, 16))
    with pytest.raises(ValueError, match="2-D"):
        compress_2_4(torch.zeros(4, 4, 4, dtype=torch.float16))


def test_sparse_matmul_refuses_bad_calls():
    s = compress_2_4(prune_2_4(torch.randn(8, 32, dtype=torch.float16)))
    b = torch.randn(32, 8, dtype=torch.float16)
    with pytest.raises(TypeError, match="Sparse24"):
        sparse_matmul(torch.randn(8, 32, dtype=torch.float16), b)
    with pytest.raises(TypeError, match="share one dtype"):
        sparse_matmul(s, b.bfloat16())
    with pytest.raises(ValueError, match="A's 32 columns"):
        sparse_matmul(s, b[:16])
    with pytest.raises(ValueError, match="CUDA device"):
        sparse_matmul(s, b)
    with pytest.raises(RuntimeError, match="no backward"):
        sparse_matmul(Sparse24(s.values.requires_grad_(), s.meta, s.k), b)


def test_forget_calls_drops_the_sparse_signatures_too():
    """``gemm.api.forget_calls`` (the benches' reset between configs) reaches the sparse
    product's remembered sm_90 calls, whose keys hold the config."""
    from attnlab.gemm import api, sparse

    sparse._wgmma_calls[("signature",)] = object()
    api.forget_calls()
    assert not sparse._wgmma_calls


def test_the_sparse_spec_takes_the_mma_sync_kernel_at_k_step_64():
    GemmSpec(SPARSE_CONFIG, "sm_80", "float16", "float16", "k", "k", sparse=True)
    for config, dtype in ((MmaGemmConfig(), "float16"),
                          (SPARSE_CONFIG.replace(async_copy=False, stages=1), "float16"),
                          (SPARSE_CONFIG, "int8")):
        with pytest.raises(ConfigError, match="2:4 sparse A"):
            GemmSpec(config, "sm_80", dtype, dtype, "k", "k", sparse=True)


def test_the_sparse_spec_on_the_wgmma_kernel_takes_k_major_16_bit_a_at_64_or_128():
    """A's kept halves reach ``wgmma.mma_async.sp`` K-major, a 32-deep step pair a stage; B
    either way. With half of A's bytes a stage the ring is one stage deeper."""
    for bk, b_major in ((64, "n"), (128, "k")):
        GemmSpec(WIDE_SPARSE_TILE.replace(block_k=bk), "sm_90a", "bfloat16", "bfloat16",
                 "k", b_major, sparse=True)
    for config, dtype, a_major in ((GemmConfig(block_k=32), "float16", "k"),
                                   (GemmConfig(), "float16", "m"), (GemmConfig(), "int8", "k")):
        with pytest.raises(ConfigError, match="2:4 sparse A"):
            GemmSpec(config, "sm_90a", dtype, dtype, a_major, "n", sparse=True)
    dense_tile = GemmConfig(sparse_meta="global")
    assert dense_tile.ring_stages("sm_90a", "bfloat16", "bfloat16", sparse=True) == 4
    assert dense_tile.ring_stages("sm_90a", "bfloat16", "bfloat16") == 3
    assert WIDE_SPARSE_TILE.ring_stages("sm_90a", "bfloat16", "bfloat16", sparse=True) == 2
    assert SPARSE_WGMMA_CONFIG.ring_stages("sm_90a", "bfloat16", "bfloat16", sparse=True) == 3


@pytest.mark.parametrize("tile", [(128, 256, 128), (128, 256, 64), (192, 128, 128),
                                  (128, 192, 128), (128, 128, 128), (64, 256, 128)])
def test_the_metadata_ring_fits_beside_the_stages(tile):
    """``sparse_meta="tma"`` (the default) adds a ring of words with one slot fewer than the
    A/B stages, each slot a K group's words of the tile's rows (16 bytes a row); the stages,
    slots, C's tile and the barriers fit in shared memory, and the default tile keeps its two
    stages (two slots would not fit: 2 x 82 KiB + 64 KiB of C is over 227 KiB). Without 2:4
    sparse A or with ``"global"`` there is no such ring."""
    bm, bn, bk = tile
    cfg = GemmConfig(block_m=bm, block_n=bn, block_k=bk)
    stages = cfg.ring_stages("sm_90a", "bfloat16", "bfloat16", sparse=True)
    slots = cfg.meta_slots(stages, sparse=True)
    assert slots == stages - 1 and cfg.meta_bytes() == bm * 16
    used = (stages * cfg.stage_bytes("bfloat16", sparse=True) + slots * cfg.meta_bytes()
            + cfg.epilogue_bytes("bfloat16") + BARRIER_BYTES)
    assert used <= SMEM_CAPACITY["sm_90a"]
    assert used + cfg.stage_bytes("bfloat16", sparse=True) + cfg.meta_bytes() > (
        SMEM_CAPACITY["sm_90a"]) or stages == 8
    assert cfg.meta_slots(stages, sparse=False) == 0
    assert cfg.replace(sparse_meta="global").meta_slots(stages, sparse=True) == 0
    if tile == (128, 256, 128):
        assert stages == 2 and slots == 1
        with pytest.raises(ConfigError, match=r"metadata words' ring.*fit 2 ring stages"):
            cfg.replace(stages=3).ring_stages("sm_90a", "bfloat16", "bfloat16", sparse=True)


def test_sparse_meta_is_a_checked_knob_of_the_sparse_kernel_only():
    """The knob takes ``"tma"`` or ``"global"``; the label names the non-default one; a dense
    spec refuses ``"global"`` (the same binary under another name)."""
    with pytest.raises(ConfigError, match="sparse_meta must be one of"):
        GemmConfig(sparse_meta="ldg")
    assert GemmConfig().sparse_meta == "tma" and "meta" not in GemmConfig().label()
    old = GemmConfig(block_k=128, sparse_meta="global")
    assert old.label().endswith(" meta-global")
    GemmSpec(old, "sm_90a", "bfloat16", "bfloat16", "k", "k", sparse=True)
    with pytest.raises(ConfigError, match="sparse_meta is the 2:4 sparse kernel's knob"):
        GemmSpec(old, "sm_90a", "bfloat16", "bfloat16", "k", "k")
    assert GemmSpec.from_dict(GemmSpec(old, "sm_90a", "bfloat16", "bfloat16", "k", "k",
                                       sparse=True).to_dict()).config == old


def test_a_gemm_config_is_the_sm90_kernels():
    s = compress_2_4(prune_2_4(torch.randn(8, 32, dtype=torch.float16)))
    b = torch.randn(32, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="CUDA device"):
        sparse_matmul(s, b, config=GemmConfig())


@pytest.mark.parametrize(("b_major", "block_k", "sparse_meta"),
                         [("n", 64, "tma"), ("k", 64, "tma"), ("n", 128, "tma"),
                          ("k", 128, "tma"), ("k", 128, "global"), ("n", 64, "global")])
def test_sparse_wgmma_kernel_is_hgmma_sp_on_half_of_a(b_major, block_k, sparse_meta, tmp_path):
    """Per K tile a consumer warpgroup issues one ``HGMMA.SP.64x256x32`` per 32-deep step (the
    first tile's and the loop's: 2 x block_k / 32 in the binary) and no dense GMMA, B
    transposed (``tnspB``) when it is N-major; a K tile's metadata words are one vector load
    (``wgmma_words``: 16 bytes at a 128-deep step, 8 at a 64-deep one), from the words' ring
    in shared memory (``sparse_meta="tma"``: no global load at all, the producer's TMA
    copies one more a K tile) or from global memory; one wait a K tile (one stage in flight:
    the metadata registers), none after each MMA; no instruction writes the metadata
    register of an MMA in flight (``retire_words``; the checker finds nine such writes in the
    build that replaced the words by plain moves, which failed on the GPU past the first K
    tile); nothing spills."""
    from attnlab.analysis.resources import read_resources
    from attnlab.analysis.sass import disassemble, histogram, parse, sparse_metadata_hazards
    from attnlab.jit import compile_spec, dumped_binary

    config = WIDE_SPARSE_TILE.replace(block_k=block_k, sparse_meta=sparse_meta)
    compile_spec(GemmSpec(config, "sm_90a", "bfloat16", "bfloat16", "k", b_major, sparse=True),
                 tmp_path)
    cubin = dumped_binary(tmp_path)[0]
    sass = disassemble(cubin)
    ops = histogram(parse(sass))
    lines = [line for line in sass.splitlines() if "GMMA" in line]
    steps = block_k // 32
    assert len(lines) == 2 * steps, lines
    assert all("HGMMA.SP.64x256x32.F32.BF16" in line for line in lines), lines
    assert all(("tnspB" in line) == (b_major == "n") for line in lines), lines
    # One vector load of a K tile's words at each of 2 call sites (a tile's first K tile,
    # the loop's).
    words, other = ("LDS", "LDG") if sparse_meta == "tma" else ("LDG", "LDS")
    assert ops[words] == 2 and ops[other] == 0, (ops[words], ops[other])
    width = f"LDS.{32 * steps} " if sparse_meta == "tma" else f"LDG.E.{32 * steps} "
    assert all(width in line for line in sass.splitlines() if f" {words}" in line)
    # The producer's copies a K tile: A's box, B's (one per 64 elements of its unit-stride
    # mode: the 128-byte swizzle's width), and with the ring the words' box.
    copies = 1 + (config.block_n if b_major == "n" else block_k) // 64
    copies += sparse_meta == "tma"
    assert ops["UTMALDG"] == copies, ops["UTMALDG"]
    assert sass.count("WARPGROUP.DEPBAR") == 2, sass.count("WARPGROUP.DEPBAR")
    assert not sparse_metadata_hazards(sass)
    assert not read_resources(cubin, sass).spills


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_sparse_kernel_is_mma_sp_on_half_of_a(arch, dtype, tmp_path):
    """Per K tile of 64 a warp of the default tile (8 warps of 64 x 64 on 128 x 256) issues one
    ``HMMA.SP.16832`` per 16 x 8 output block and 32-deep step (4 x 8 x 2 = 64) and no dense
    MMA; A's fragments come by 8 ``ldmatrix.x4``, B's by 32 ``.x2`` (one n8 block's k16 pair
    each, so that two of them fill mma.sp's B register quad: with ``.x4`` across two n8 blocks
    ptxas moved 4 registers per MMA, 148 MOVs and 896 instructions against 23 and 656); A's
    tile is a fifth of the ``cp.async`` copies (2 of a thread's 16-byte copies against B's 8,
    at the ring's prologue and in the loop); the metadata comes by 16 16-bit loads (rows g and
    g + 8 of four M atoms, two steps); nothing spills."""
    from attnlab.analysis.resources import read_resources
    from attnlab.analysis.sass import disassemble, histogram, parse
    from attnlab.jit import compile_spec, dumped_binary

    compile_spec(GemmSpec(SPARSE_CONFIG, arch, dtype, dtype, "k", "k", sparse=True), tmp_path)
    cubin = dumped_binary(tmp_path)[0]
    sass = disassemble(cubin)
    ops = histogram(parse(sass))
    mmas = [i.opcode for i in parse(sass) if i.base.endswith("MMA")]
    assert len(mmas) == 64 and all(x.startswith("HMMA.SP.16832.F32") for x in mmas), mmas
    assert ops["LDSM"] == 8 + 32 and ops["LDGSTS"] == 2 * (2 + 8) and ops["LDG"] == 16
    assert ops["MOV"] < len(mmas), ops["MOV"]
    assert not read_resources(cubin, sass).spills


@pytest.mark.xfail(raises=AttributeError, strict=True,
                   reason="CuTe DSL 4.8.1: cute_nvgpu has no MmaAtomSM80SparseType")
def test_dsl_sparse_warp_atom_builds():
    """Fails while the DSL's ``MmaF16BF16SparseOp`` cannot build its atom; a release that
    fixes it turns this into an unexpected pass, the sign to move the sparse kernel onto it."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import warp

    op = warp.MmaF16BF16SparseOp(cutlass.Float16, cutlass.Float32, (16, 8, 32),
                                 warp.SparseMetadataFormat.TID)

    @cute.jit
    def build():
        cute.make_tiled_mma(op, (1, 1, 1))

    build()


def test_sparse_bench_parses_its_options_before_needing_a_gpu():
    """``attnlab bench --family sparse`` refuses int8 (no sparse INT8 kernel) and bad shapes
    with a usage error, before it looks for a GPU."""
    from typer.testing import CliRunner

    from attnlab.cli import app

    result = CliRunner().invoke(app, ["bench", "--family", "sparse", "--dtypes", "int8"])
    assert result.exit_code == 2 and "bf16 and/or fp16" in result.output
    result = CliRunner().invoke(app, ["bench", "--family", "sparse", "--shapes", "64x64"])
    assert result.exit_code == 2 and "MxNxK" in result.output


def test_sass_takes_the_mma_sync_forms_by_name():
    """``attnlab sass sparse24 --vs online_int8``: the two library forms of the ``mma.sync``
    kernel at their default tiles (their MMAs' variants: the compile tests)."""
    import json

    from typer.testing import CliRunner

    from attnlab.cli import app

    result = CliRunner().invoke(app, ["sass", "sparse24", "--vs", "online_int8", "--arch",
                                      "sm_80", "--dtype", "float16", "--json"])
    assert result.exit_code == 0, result.output
    opcodes = [set(k["sass"]["opcodes"]) for k in json.loads(result.output)["kernels"]]
    assert "HMMA" in opcodes[0] and "IMMA" not in opcodes[0], opcodes
    assert "IMMA" in opcodes[1] and "HMMA" not in opcodes[1], opcodes


def test_the_hazard_walk_follows_the_loop_back_edge():
    """A load at the top of a loop body into the metadata register of the sparse MMA at its
    bottom is a hazard (the MMA of the previous trip is in flight); after the wait it is not."""
    from attnlab.analysis.sass import sparse_metadata_hazards

    loop = [".L_x_1:", "LDG.E.U16 R152, desc[UR4][R2.64]",
            "WARPGROUP.DEPBAR.LE gsb0, 0x0",
            "HGMMA.SP.64x256x32.F32.BF16 R24, gdesc[UR12], R24, R152, 0x0, gsb0",
            "@P0 BRA `(.L_x_1)", "EXIT"]

    def sass(lines):
        out, i = [], 0
        for line in lines:
            if line.endswith(":"):
                out.append(line)
            else:
                out.append(f"        /*{16 * i:04x}*/                   {line} ;")
                i += 1
        return "\n".join(out)

    hazards = sparse_metadata_hazards(sass(loop))
    assert [h.opcode for h in hazards] == ["LDG.E.U16"]
    safe = [loop[0], loop[2], loop[1], *loop[3:]]
    assert not sparse_metadata_hazards(sass(safe))


@pytest.mark.parametrize("shape", [(37, 300), (16, 128), (130, 1000), (400, 64)])
def test_wgmma_words_are_each_thread_pairs_metadata_in_load_order(shape):
    """Word ``[b, g, 2 r + h, t]`` holds metadata column ``8 g + 2 t + h`` of rows ``16 b + r``
    (low half) and ``16 b + r + 8`` (high half), ``PAD_META`` past M and K, M padded to a
    multiple of ``WORDS_ROWS`` (384: every tile height divides it); made once."""
    gen = torch.Generator().manual_seed(sum(shape))
    s = compress_2_4(prune_2_4(torch.randn(*shape, generator=gen).half()))
    words = wgmma_words(s)
    rows, cols = s.meta.shape
    blocks = -(-rows // WORDS_ROWS) * WORDS_ROWS // 16
    assert words.shape == (blocks, -(-cols // 8), 16, 4) and words.is_contiguous()
    # Every tile's TMA box of words lies inside, and what lies past M is the padding
    # selector, not the TMA unit's zero fill (0b0000 is no selector: PTX leaves it undefined).
    assert all(blocks % (block_m // 16) == 0 for block_m in BLOCK_MS)
    past = words[-(-rows // 16):]
    assert bool((past == (PAD_META | PAD_META << 16)).all()) and blocks * 16 - rows >= 0

    def field(row, col):
        return int(s.meta[row, col]) & 0xFFFF if row < rows and col < cols else PAD_META

    for b, g, place, t in zip(*(torch.randint(0, n, (200,), generator=gen).tolist()
                                for n in words.shape), strict=True):
        r, h = divmod(place, 2)
        col = 8 * g + 2 * t + h
        expected = field(16 * b + r, col) | field(16 * b + r + 8, col) << 16
        assert int(words[b, g, place, t]) & 0xFFFFFFFF == expected, (b, g, place, t)
    assert wgmma_words(s) is words


def test_sparse_ladder_puts_each_sparse_kernel_beside_its_dense_one():
    """``attnlab ladder --family sparse``: s02 (``mma.sp``) against s01 (the same tile dense),
    s04 (``wgmma.sp``, its words from global memory), s05 (its words by a TMA ring) and s06
    (the default tile) against s03 (the dense wgmma kernel); the wgmma steps only on
    sm_90a; the CLI asks for a GPU once its options parse."""
    from typer.testing import CliRunner

    from attnlab.cli import app
    from attnlab.gemm.ladder import SPARSE_BASES, SPARSE_STEPS, sparse_step, sparse_steps_for

    assert list(SPARSE_STEPS) == sorted(SPARSE_STEPS)
    for name, base in SPARSE_BASES.items():
        assert base < name and SPARSE_STEPS[base][1] is False
    assert [name for name, step in SPARSE_STEPS.items() if step[1]] == ["s02", "s04", "s05",
                                                                        "s06"]
    assert SPARSE_STEPS["s04"][0] == WIDE_SPARSE_TILE.replace(sparse_meta="global")
    assert SPARSE_STEPS["s05"][0] == WIDE_SPARSE_TILE
    assert SPARSE_STEPS["s06"][0] == SPARSE_WGMMA_CONFIG
    assert set(sparse_steps_for("sm_80")) == {"s01", "s02"}
    assert set(sparse_steps_for("sm_90a")) == set(SPARSE_STEPS)
    assert all(callable(sparse_step(name)) for name in SPARSE_STEPS)
    result = CliRunner().invoke(app, ["ladder", "--family", "sparse"])
    assert result.exit_code == 2 and "needs a CUDA GPU" in result.output, result.output


def test_the_wgmma_tile_follows_the_waves():
    """The default (192 x 128) tile where its waves of persistent tiles fill the SMs about as
    well as the wide one's; the wide tile (words from global memory) where the default would
    start a second, mostly idle wave: 2048^2 on 132 SMs (176 tiles against 128)."""
    wide = WIDE_SPARSE_TILE.replace(sparse_meta="global")
    assert wgmma_tile_for(2048, 2048, 132) == wide
    for m, n in ((8192, 8192), (4096, 14336), (4096, 4096)):
        assert wgmma_tile_for(m, n, 132) == SPARSE_WGMMA_CONFIG, (m, n)
