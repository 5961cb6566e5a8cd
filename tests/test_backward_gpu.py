"""GPU correctness of the backward pass (issue 20) against fp64 autograd of the reference.

The bound: our dQ, dK and dV relative L2 errors against the fp64 reference's gradients may be
at most 1.5x those of torch SDPA's gradients on the same inputs and the same incoming
gradient (flash for no mask and causal with Sq == Sk, the efficient backend with an explicit
mask otherwise; k/v heads expanded for SDPA, their gradients summed back per group). Inputs
and incoming gradients are fresh standard normals; the memory the backward allocates its
outputs from is filled with NaN first (``poison_allocator``), so an unwritten element fails.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnlab
from attnlab import reference
from attnlab.config import ConfigError

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ERROR_FLOOR = 1e-6


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(x.double() - ref) / torch.linalg.vector_norm(ref)).item()


def poison_allocator(megabytes: int = 512) -> None:
    """Fill cached free memory with NaN, so new allocations start as NaN."""
    block = torch.full((megabytes << 18,), math.nan, device="cuda")
    del block


def arch() -> str:
    from attnlab import device

    return device.info(torch.device("cuda")).arch


def randn(*shape, dtype, gen):
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)


def dense_case(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, seed, scale=1.0):
    """q, k, v (requiring grad) and an incoming gradient, standard normal (q times
    ``scale``: large logits move the running max)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = (randn(batch, seqlen_q, heads, head_dim, dtype=dtype, gen=gen) * scale).to(dtype)
    k = randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, gen=gen)
    v = randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, gen=gen)
    dout = randn(batch, seqlen_q, heads, head_dim, dtype=dtype, gen=gen)
    return [t.requires_grad_(True) for t in (q, k, v)], dout


def reference_grads(q, k, v, dout, window, scale):
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    out = reference.attention(*leaves, softmax_scale=scale, window_size=window,
                              compute_dtype=torch.float64)
    return torch.autograd.grad(out, leaves, dout.double())


def sdpa_grads(q, k, v, dout, window, scale):
    """SDPA's gradients (the yardstick), k/v heads expanded and summed back per group."""
    group = q.shape[2] // k.shape[2]
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    qh, kh, vh = (t.transpose(1, 2) for t in (leaves[0], leaves[1].repeat_interleave(group, 2),
                                               leaves[2].repeat_interleave(group, 2)))
    mask = reference.window_mask(q.shape[1], k.shape[1], window, q.device)
    if mask is None or (window == (-1, 0) and q.shape[1] == k.shape[1]):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(qh, kh, vh, scale=scale,
                                                 is_causal=mask is not None)
    else:
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return torch.autograd.grad(out.transpose(1, 2), leaves, dout)


def our_grads(q, k, v, dout, window, scale, **kwargs):
    poison_allocator()
    out = attnlab.attention(q, k, v, softmax_scale=scale, window_size=window, **kwargs)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    return grads


def check_grads(ours, theirs, ref, what: str) -> None:
    for name, o, t, r in zip("qkv", ours, theirs, ref, strict=True):
        assert not o.isnan().any(), f"{what}: d{name} has NaN (unwritten or poisoned)"
        mine, yard = rel_l2(o, r), rel_l2(t, r)
        assert mine <= max(1.5 * yard, ERROR_FLOOR), (
            f"{what}: d{name} rel L2 error {mine:.3e} > 1.5 x SDPA's {yard:.3e}")


# (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, window)
CASES = [
    (2, 1024, 1024, 4, 4, 64, (-1, -1)),
    (2, 1024, 1024, 4, 4, 128, (-1, 0)),
    (1, 777, 777, 4, 4, 128, (-1, -1)),  # odd lengths: tails in both walks
    (2, 300, 517, 4, 2, 64, (-1, -1)),  # Sq != Sk, GQA
    (2, 517, 300, 8, 2, 64, (-1, 0)),  # Sq > Sk causal: the first rows see no key
    (1, 1000, 1000, 4, 1, 32, (-1, 0)),  # MQA
    (1, 1000, 1000, 4, 4, 96, (128, 64)),  # sliding window
    (2, 640, 900, 4, 4, 128, (100, 0)),
    # Above hd128 (sm_90a): the warpgroups split the head dim.
    (2, 700, 700, 4, 2, 192, (-1, -1)),
    (1, 517, 900, 4, 4, 256, (-1, 0)),
    (1, 1000, 1000, 4, 1, 256, (200, 50)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:6])) + f"w{c[6]}")
def test_gradients_match_the_reference(case, dtype):
    *shape, window = case
    from attnlab.backward_config import backward_head_dims

    if shape[-1] not in backward_head_dims(arch()):
        pytest.skip(f"no backward tile at hd{shape[-1]} fits this GPU's shared memory")
    (q, k, v), dout = dense_case(*shape, DTYPES[dtype], seed=sum(shape))
    scale = 1.0 / math.sqrt(shape[-1])
    ref = reference_grads(q, k, v, dout, window, scale)
    # Rows that see no key have no gradient: SDPA's efficient backend leaves NaN there.
    theirs = [g.nan_to_num(0.0) for g in sdpa_grads(q, k, v, dout, window, scale)]
    check_grads(our_grads(q, k, v, dout, window, scale), theirs, ref, f"{case} {dtype}")


def test_large_logits_move_the_running_max():
    (q, k, v), dout = dense_case(2, 512, 512, 4, 4, 64, torch.bfloat16, seed=3, scale=8.0)
    ref = reference_grads(q, k, v, dout, (-1, 0), 0.125)
    check_grads(our_grads(q, k, v, dout, (-1, 0), 0.125),
                sdpa_grads(q, k, v, dout, (-1, 0), 0.125), ref, "large logits")


@pytest.mark.parametrize("kernel", ["default", "mma_sync_dq_first"])
def test_varlen_with_empty_sequences_matches_per_sequence_reference(kernel):
    """Through autograd with the default kernel; the mma.sync kernel in FA2's GEMM order
    (unchecked dQ adds for query blocks inside a sequence) through its config."""
    from attnlab import backward
    from attnlab.backward_config import BackwardConfig

    seqlens_q, seqlens_k = [0, 130, 1, 517, 64], [0, 200, 77, 517, 0]
    gen = torch.Generator(device="cuda").manual_seed(11)
    dt = torch.bfloat16
    q = randn(sum(seqlens_q), 4, 64, dtype=dt, gen=gen).requires_grad_(True)
    k = randn(sum(seqlens_k), 2, 64, dtype=dt, gen=gen).requires_grad_(True)
    v = randn(sum(seqlens_k), 2, 64, dtype=dt, gen=gen).requires_grad_(True)
    dout = randn(sum(seqlens_q), 4, 64, dtype=dt, gen=gen)

    def offsets(lengths):
        return torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)

    poison_allocator()
    cu_q, cu_k = offsets(seqlens_q), offsets(seqlens_k)
    if kernel == "default":
        out = attnlab.attention_varlen(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),
                                       causal=True)
        ours = torch.autograd.grad(out, (q, k, v), dout)
    else:
        out, lse = attnlab.attention_varlen(q.detach(), k.detach(), v.detach(), cu_q, cu_k,
                                            max(seqlens_q), max(seqlens_k), causal=True,
                                            return_lse=True)
        ours = backward.attention_backward(
            dout, q.detach(), k.detach(), v.detach(), out, lse, None, cu_q, cu_k,
            max(seqlens_q), max(seqlens_k), 0.125, (-1, 0),
            config=BackwardConfig(dq_first=True))
    # Per sequence: the dense reference and SDPA on that sequence's rows.
    qs, ks, dos = offsets(seqlens_q).tolist(), offsets(seqlens_k).tolist(), []
    refs, yards = [[], [], []], [[], [], []]
    for b in range(len(seqlens_q)):
        sq, sk = slice(qs[b], qs[b + 1]), slice(ks[b], ks[b + 1])
        part = [t[None, s] for t, s in ((q, sq), (k, sk), (v, sk))]
        do = dout[None, sq]
        dos.append(do)
        if part[0].shape[1] and part[1].shape[1]:
            ref = reference_grads(*part, do, (-1, 0), 0.125)
            yard = [g.nan_to_num(0.0) for g in sdpa_grads(*part, do, (-1, 0), 0.125)]
        else:
            ref = [torch.zeros(t.shape, dtype=torch.float64, device="cuda") for t in part]
            yard = [torch.zeros_like(t) for t in part]
        for i in range(3):
            refs[i].append(ref[i][0])
            yards[i].append(yard[i][0])
    ref = [torch.cat(r) for r in refs]
    check_grads(ours, [torch.cat(y) for y in yards], ref, "varlen")


def test_gradient_through_the_lse():
    (q, k, v), dout = dense_case(1, 300, 400, 4, 2, 64, torch.bfloat16, seed=21)
    dlse = torch.randn(1, 4, 300, device="cuda")
    out, lse = attnlab.attention(q, k, v, causal=True, return_lse=True)
    ours = torch.autograd.grad((out, lse), (q, k, v), (dout, dlse))
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref_out, ref_lse = reference.attention(*leaves, causal=True, return_lse=True,
                                           compute_dtype=torch.float64)
    ref = torch.autograd.grad((ref_out, ref_lse), leaves, (dout.double(), dlse.double()))
    # SDPA has no LSE gradient: the yardstick is the output-only one's error, doubled.
    yard = sdpa_grads(q, k, v, dout, (-1, 0), 1 / 8)
    plain = reference_grads(q, k, v, dout, (-1, 0), 1 / 8)
    for name, o, r, y, p in zip("qkv", ours, ref, yard, plain, strict=True):
        assert rel_l2(o, r) <= max(3 * rel_l2(y, p), ERROR_FLOOR), f"d{name}"


def test_only_some_inputs_require_grad_and_no_grad_pays_nothing():
    (q, k, v), dout = dense_case(1, 256, 256, 4, 4, 64, torch.float16, seed=5)
    k.requires_grad_(False)
    out = attnlab.attention(q, k, v)
    dq, dv = torch.autograd.grad(out, (q, v), dout)
    ref = reference_grads(q, k, v, dout, (-1, -1), 0.125)
    assert rel_l2(dq, ref[0]) < 2e-2 and rel_l2(dv, ref[2]) < 2e-2
    with torch.no_grad():
        assert attnlab.attention(q, k, v).grad_fn is None
    assert attnlab.attention(q.detach(), k, v.detach()).grad_fn is None


def test_deterministic_gradients_are_bitwise_repeatable():
    (q, k, v), dout = dense_case(2, 1024, 1024, 8, 2, 64, torch.bfloat16, seed=8)
    runs = [our_grads(q, k, v, dout, (-1, 0), 0.125, deterministic=True) for _ in range(3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            assert torch.equal(a, b)
    ref = reference_grads(q, k, v, dout, (-1, 0), 0.125)
    check_grads(runs[0], sdpa_grads(q, k, v, dout, (-1, 0), 0.125), ref, "deterministic")


def test_unsupported_backward_says_what_and_out_is_not_differentiable():
    from attnlab import backward
    from attnlab.backward_config import BackwardConfig

    (q, k, v), dout = dense_case(1, 128, 128, 2, 2, 256, torch.bfloat16, seed=1)
    out, lse = attnlab.attention(q, k, v, return_lse=True)  # the forward works at any head dim
    with pytest.raises(ConfigError, match="the warps must split the head dim"):
        backward.attention_backward(dout, q.detach(), k.detach(), v.detach(), out.detach(),
                                    lse.detach(), None, None, None, None, None, 0.0625,
                                    (-1, -1), config=BackwardConfig())
    (q, k, v), _ = dense_case(1, 128, 128, 2, 2, 64, torch.bfloat16, seed=1)
    with pytest.raises(RuntimeError, match="out= is not differentiable"):
        attnlab.attention(q, k, v, out=torch.empty_like(q))


def test_torch_compile_fullgraph_backward_equals_eager():
    torch.compiler.reset()
    (q, k, v), dout = dense_case(2, 300, 300, 4, 2, 64, torch.bfloat16, seed=4)

    def loss(q, k, v):
        return (attnlab.attention(q, k, v, causal=True).float() * dout.float()).sum()

    eager = torch.autograd.grad(loss(q, k, v), (q, k, v))
    compiled = torch.compile(loss, fullgraph=True)
    traced = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    for a, b in zip(eager, traced, strict=True):
        assert torch.equal(a, b)


class Block(torch.nn.Module):
    """A pre-norm transformer block whose attention is ``attn(q, k, v)`` on BSHD tensors."""

    def __init__(self, dim: int, heads: int, attn):
        super().__init__()
        self.heads, self.attn = heads, attn
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        x = x + self.proj(self.attn(q, k, v).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


def sdpa_bshd(q, k, v):
    return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                          is_causal=True).transpose(1, 2)


def test_training_loop_loss_matches_sdpa():
    """Two blocks, a few Adam steps on a fixed batch: the loss curves agree within bf16
    noise (same initial weights, same data)."""
    losses = {}
    for name, attn in (("attnlab", lambda q, k, v: attnlab.attention(q, k, v, causal=True)),
                       ("sdpa", sdpa_bshd)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(Block(256, 4, attn), Block(256, 4, attn)).cuda()
        model = model.to(torch.bfloat16)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        gen = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(4, 256, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
        target = torch.randn(4, 256, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
        curve = []
        for _ in range(8):
            opt.zero_grad()
            loss = F.mse_loss(model(x).float(), target.float())
            loss.backward()
            opt.step()
            curve.append(loss.item())
        losses[name] = curve
    ours, theirs = losses["attnlab"], losses["sdpa"]
    assert ours[-1] < ours[0] * 0.9, f"attnlab's loss does not fall: {ours}"
    for a, b in zip(ours, theirs, strict=True):
        assert abs(a - b) <= 0.02 * abs(b), f"loss curves diverge: {ours} vs {theirs}"


#: (config knobs, head dim) of each backward kernel and tile the GPU may run.
KERNELS = {"mma_sync": ({}, 128), "mma_sync_bm32": ({"block_m": 32}, 128),
           "mma_sync_kv_n2": ({"kv_warps_n": 2}, 128),
           "mma_sync_kv_n2_hd64": ({"kv_warps_n": 2, "dq_warps_m": 2}, 64),
           "mma_sync_dq_first": ({"dq_first": True}, 128),
           "mma_sync_kv_n2_dq_first": ({"kv_warps_n": 2, "dq_warps_m": 2, "dq_first": True},
                                       128),
           "wgmma": ({"wgmma": True}, 128),
           "wgmma_bm128": ({"wgmma": True, "block_m": 128}, 64),
           "wgmma_split_d": ({"wgmma": True, "block_n": 64, "producer_warp": True}, 128),
           "mma_sync_split_d": ({"block_n": 64, "block_m": 32}, 256)}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)])
def test_each_backward_kernel_matches_the_reference(kernel, window):
    """Every kernel and tile where the GPU runs it (the mma.sync kernel on any sm80+ GPU,
    the wgmma one on sm_90a), through ``backward.attention_backward`` with its config."""
    from attnlab.backward_config import BackwardConfig

    knobs, head_dim = KERNELS[kernel]
    if knobs.get("wgmma") and arch() != "sm_90a":
        pytest.skip("the wgmma kernel needs sm_90a")
    _check_backward_config(BackwardConfig(**knobs), head_dim, window, kernel)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)])
@pytest.mark.parametrize("built_for", ["sm_80", "this GPU"])
def test_sm80_default_backward_matches_the_reference(head_dim, window, built_for):
    """The mma.sync defaults as an sm80 GPU builds them (``lpt``; at hd128 -O3 without a
    mask, -O1 with one) and as this GPU's sm80 path (``mma_sync_backward_for``: on Hopper
    FA2's GEMM order), run here on any sm80+ GPU."""
    from attnlab.backward_config import mma_sync_backward_for

    config = mma_sync_backward_for("sm_80" if built_for == "sm_80" else arch(), head_dim,
                                   window != (-1, -1), "bfloat16")
    _check_backward_config(config, head_dim, window, f"sm80 path hd{head_dim} {config}")


def _check_backward_config(config, head_dim: int, window: tuple[int, int], label: str) -> None:
    """dQ, dK, dV of ``config`` through ``backward.attention_backward`` on a GQA case with
    odd lengths against the fp64 reference, within 1.5x SDPA's own error."""
    from attnlab import backward

    (q, k, v), dout = dense_case(2, 700, 900, 8, 2, head_dim, torch.bfloat16, seed=31)
    scale = 1 / math.sqrt(head_dim)
    out, lse = attnlab.attention(q.detach(), k.detach(), v.detach(), window_size=window,
                                 return_lse=True)
    poison_allocator()
    ours = backward.attention_backward(dout, q.detach(), k.detach(), v.detach(), out, lse,
                                       None, None, None, None, None, scale, window,
                                       config=config)
    ref = reference_grads(q, k, v, dout, window, scale)
    theirs = [g.nan_to_num(0.0) for g in sdpa_grads(q, k, v, dout, window, scale)]
    check_grads(ours, theirs, ref, f"{label} {window}")


def test_sdpa_drop_in_is_differentiable():
    """``attnlab.sdpa`` on BHSD inputs (torch's top-left causal, GQA): gradients within 1.5x
    of torch SDPA's own error against the fp64 reference."""
    gen = torch.Generator(device="cuda").manual_seed(41)
    q = randn(2, 8, 300, 64, dtype=torch.bfloat16, gen=gen).requires_grad_(True)
    k = randn(2, 2, 300, 64, dtype=torch.bfloat16, gen=gen).requires_grad_(True)
    v = randn(2, 2, 300, 64, dtype=torch.bfloat16, gen=gen).requires_grad_(True)
    dout = randn(2, 8, 300, 64, dtype=torch.bfloat16, gen=gen)
    ours = torch.autograd.grad(attnlab.sdpa(q, k, v, is_causal=True, enable_gqa=True),
                               (q, k, v), dout)
    bshd = [t.transpose(1, 2) for t in (q, k, v)]
    ref = reference_grads(*bshd, dout.transpose(1, 2), (-1, 0), 0.125)
    theirs = sdpa_grads(*bshd, dout.transpose(1, 2), (-1, 0), 0.125)
    check_grads([g.transpose(1, 2) for g in ours], theirs, ref, "sdpa")
