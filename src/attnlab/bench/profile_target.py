"""The program Nsight Compute profiles: exactly one launch of one implementation.

``python -m attnlab.bench.profile_target --impl attnlab --config k07 --shape 4,4096,4096,16,128``
calls ``attention()`` once (it compiles or loads the kernel, then launches it once), so
``ncu -c 1`` with a kernel name filter catches that launch and no warm-up. ``--config default``
runs what a user's call runs on this GPU; ``--impl`` also takes the peers of
``attnlab.bench.baselines`` (``sdpa_flash``, ``sdpa_cudnn``, ``fa4``).
"""

from __future__ import annotations

import argparse
import math

import torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--impl", choices=["attnlab", "sdpa_flash", "sdpa_cudnn", "fa4"],
                        required=True)
    parser.add_argument("--config", default="k07")
    parser.add_argument("--shape", default="4,4096,4096,16,128", help="B,Sq,Sk,H,D")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args(argv)

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


if __name__ == "__main__":
    main()
