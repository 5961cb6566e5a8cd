"""Where a decoding call's host time goes (issue 21's host-bound points: B = 1 x 4k, where a
call's host side is 60 us against 17 us on the device).

Usage (GPU): python scripts/decode_host.py [--out DIR]
For B = 1 and 8 at 4k keys, GQA 32/8 and MQA 8/1, hd128 bf16, on the contiguous cache and
on its paged copy (``attnlab bench --decode``'s inputs): host microseconds per call
(``bench.timing.host_us_per_call``: calls enqueued without waiting) of
``attention_with_kvcache`` whole, of SDPA flash on the same tensors (the FA2 peer), and of
the call's parts in isolation: the signature lookup, the output's allocation, the
per-stream scratch (partials and an unread LSE) lookup, and each kernel launch (decode,
combine) on preallocated buffers; then the cProfile of 2,000 whole calls (top 12 by own
time). Prints a table, writes OUT/decode_host.json and OUT/decode_host_profile.txt.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import itertools
import json
import pstats
from pathlib import Path

import torch

import attnlab
from attnlab import decode
from attnlab.bench.decode import decode_sets
from attnlab.bench.runner import Point
from attnlab.bench.timing import host_us_per_call

POINTS = ((1, 4096, 32, 8), (8, 4096, 32, 8), (1, 4096, 8, 1), (8, 4096, 8, 1))
HEAD_DIM = 128


def parts(q, k, v, seqlens, table) -> dict[str, float]:
    """Host microseconds of each part of one call (the remembered call's own pieces);
    ``table``: the paged cache's block table (None: contiguous)."""
    whole = {"attention_with_kvcache": lambda i: attnlab.attention_with_kvcache(
        q, k, v, cache_seqlens=seqlens, block_table=table)}
    call = next(iter(decode._calls.values()))
    batch, seqlen_q, heads_q, head_dim = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=q.device)
    partial_out = torch.empty((call.splits * batch, seqlen_q, heads_q, head_dim),
                              dtype=torch.float32, device=q.device)
    partial_lse = torch.empty((call.splits * batch, heads_q, seqlen_q), dtype=torch.float32,
                              device=q.device)
    merged = (out, lse, call.scratch(q)[-1]) if call.serial else (None, None, None)
    # An unsplit call writes the output itself.
    written = (partial_out, partial_lse) if call.splits > 1 else (out, lse)
    pieces = {
        **whole,
        "signature lookup": lambda i: decode._lookup(
            q, k, v, None, None, seqlens, None, table, None, (None, False, (-1, -1), 0)),
        "output allocation": lambda i: torch.empty_like(q, memory_format=torch.contiguous_format),
        "scratch lookup": lambda i: call.scratch(q),
        "decode launch": lambda i: call.decode(q, k, v, seqlens, None, table, *written,
                                               call.scale, call.left, call.right, call.splits,
                                               *merged),
    }
    if table is None:
        sdpa_q, sdpa_k, sdpa_v = (t.transpose(1, 2) for t in (q, k, v))
        pieces["sdpa_flash (FA2)"] = lambda i: torch.nn.functional.scaled_dot_product_attention(
            sdpa_q, sdpa_k, sdpa_v, enable_gqa=True)
    if call.combine is not None:
        pieces["combine launch"] = lambda i: call.combine(partial_out, partial_lse, out, lse,
                                                          call.splits)
    return {name: host_us_per_call(fn) for name, fn in pieces.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, profiles = [], []
    with torch.no_grad(), torch.nn.attention.sdpa_kernel(
            torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        for (batch, keys, heads_q, heads_kv), paged in itertools.product(POINTS, (False, True)):
            decode._calls.clear()
            q, k, v, k_pages, v_pages, table, seqlens = decode_sets(
                Point(batch, 1, keys, heads_q, HEAD_DIM, heads_kv=heads_kv), 1, paged=paged)[0]
            if paged:
                k, v = k_pages, v_pages

            whole = functools.partial(attnlab.attention_with_kvcache, q, k, v,
                                      cache_seqlens=seqlens, block_table=table)
            whole()
            label = f"B={batch} {keys} keys {heads_q}/{heads_kv}{' paged' if paged else ''}"
            row = {"point": label, "splits": next(iter(decode._calls.values())).splits,
                   **parts(q, k, v, seqlens, table)}
            rows.append(row)
            print(label, " ".join(f"{n}={us:.1f}" for n, us in row.items()
                                  if isinstance(us, float)), flush=True)
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(2000):
                whole()
            profiler.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
            profiles.append(f"== {label}\n{text.getvalue()}")
    (args.out / "decode_host.json").write_text(json.dumps(rows, indent=1))
    (args.out / "decode_host_profile.txt").write_text("\n".join(profiles))


if __name__ == "__main__":
    main()
