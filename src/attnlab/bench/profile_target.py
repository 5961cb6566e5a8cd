"""The program Nsight Compute profiles: exactly one launch of one implementation.

``python -m attnlab.bench.profile_target --impl attnlab --config k07 --shape 4,4096,4096,16,128``
calls ``attention()`` once (it compiles or loads the kernel, then launches it once), so
``ncu -c 1`` with a kernel name filter catches that launch and no warm-up. ``--config default``
runs what a user's call runs on this GPU; ``--impl`` also takes the peers of
``attnlab.bench.baselines`` (``sdpa_flash``, ``sdpa_cudnn``, ``fa4``). ``--family gemm``
(``--shape M,N,K``, B a transposed weight) runs ``attnlab.gemm.matmul`` or ``--impl cublas``;
``--family conv`` (``--shape N,C,HW``: a 3 x 3, padding 1, C -> C convolution with a bias,
channels-last) runs ``attnlab.conv.conv2d`` or ``--impl cudnn``.
"""

from __future__ import annotations

import argparse
import math

import torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--impl", choices=["attnlab", "sdpa_flash", "sdpa_cudnn", "fa4",
                                           "cublas", "cudnn"], required=True)
    parser.add_argument("--family", choices=["attention", "gemm", "conv"], default="attention")
    parser.add_argument("--config", default="k07")
    parser.add_argument("--shape", default="4,4096,4096,16,128", help="B,Sq,Sk,H,D")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args(argv)
    if args.family != "attention":
        lab_family(args.family, args.impl, [int(x) for x in args.shape.split(",")],
                   getattr(torch, args.dtype))
        torch.cuda.synchronize()
        return

    batch, seqlen_q, seqlen_k, heads, head_dim = (int(x) for x in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(batch, seqlen_k, heads, head_dim, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn_like(k)
    scale = 1.0 / math.sqrt(head_dim)
    if args.impl == "attnlab":
        from attnlab.api import attention
        from attnlab.ladder import resolve

        config = None if args.config == "default" else resolve(args.config)
        attention(q, k, v, softmax_scale=scale, causal=args.causal, config=config)
    else:
        from attnlab.bench.baselines import available_peers

        available_peers()[args.impl](q, k, v, scale, args.causal)
    torch.cuda.synchronize()


def lab_family(family: str, impl: str, shape: list[int], dtype: torch.dtype) -> None:
    """One GEMM (``M, N, K``) or 3 x 3 convolution (``N, C, HW``) call of attnlab or its
    peer."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    if family == "gemm":
        m, n, k = shape
        a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
        weight = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen)
        if impl == "attnlab":
            from attnlab.gemm import matmul

            matmul(a, weight.t())
        else:
            torch.matmul(a, weight.t())
        return
    batch, channels, hw = shape
    x = torch.randn(batch, channels, hw, hw, device="cuda", dtype=dtype, generator=gen).to(
        memory_format=torch.channels_last)
    w = (torch.randn(channels, channels, 3, 3, device="cuda", dtype=dtype, generator=gen)
         / (9 * channels) ** 0.5).to(memory_format=torch.channels_last)
    bias = torch.randn(channels, device="cuda", dtype=dtype, generator=gen)
    if impl == "attnlab":
        from attnlab.conv import conv2d

        conv2d(x, w, bias)
    else:
        torch.nn.functional.conv2d(x, w, bias, 1, 1)


if __name__ == "__main__":
    main()
