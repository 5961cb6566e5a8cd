"""The user-facing entry point: validate, pick a config, allocate outputs, launch the kernel."""

from __future__ import annotations

import torch

from attnlab.config import FlashConfig
from attnlab.validation import check_inputs


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    config: FlashConfig | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Non-causal attention ``softmax(scale * Q K^T) V`` on the GPU (FlashAttention-2 forward).

    Args:
        q: ``[B, Sq, H, D]`` CUDA tensor, float16 or bfloat16.
        k, v: ``[B, Sk, H, D]``, same dtype and device as ``q``. ``Sk`` may differ from ``Sq``.
            ``D`` must be one of ``attnlab.config.SUPPORTED_HEAD_DIMS`` (64, 128). Each tensor
            must be contiguous in its last dim, start on a 16-byte boundary and have strides of
            dims 0..2 that are multiples of 8 elements; ``.contiguous()`` satisfies all three.
        softmax_scale: multiplier of QK^T; ``None`` means ``1/sqrt(D)``. Any finite positive
            real number.
        return_lse: also return the natural-log log-sum-exp of each row of scaled scores.
        config: the kernel configuration; ``None`` picks the default for the GPU and problem.

    Returns:
        ``out``, a new contiguous ``[B, Sq, H, D]`` tensor in q's dtype, or ``(out, lse)`` with
        ``lse`` a float32 ``[B, H, Sq]`` tensor. With ``B``, ``Sq`` or ``H`` zero the results are
        empty and no kernel runs. With ``Sk == 0`` no kernel runs either: ``out`` is zeros and
        ``lse`` is -inf, as in :func:`attnlab.reference.attention`.

    Raises:
        TypeError: ``config`` is neither None nor a FlashConfig; a non-tensor input; an
            unsupported or mismatched dtype; a softmax_scale that is not a real number. The
            config type is checked first: a wrong-typed config is a mistake whatever the tensors.
        ValueError: bad rank, shapes, head dim, layout or softmax_scale; tensors not on CUDA or
            not on one device (see :func:`attnlab.validation.check_inputs`).
        attnlab.ConfigError: (a ValueError) the config cannot serve this head dim on this GPU,
            e.g. its tiles overflow shared memory.
    """
    if config is not None and not isinstance(config, FlashConfig):
        raise TypeError(
            f"config must be an attnlab.FlashConfig or None, got {type(config).__name__} "
            f"{config!r}"
        )
    problem = check_inputs(q, k, v, softmax_scale=softmax_scale)
    # out is always a fresh dense BSHD tensor, even when q is a strided view.
    out = torch.empty(
        (problem.batch, problem.seqlen_q, problem.num_heads, problem.head_dim),
        dtype=q.dtype,
        device=q.device,
    )
    lse = torch.empty(
        (problem.batch, problem.num_heads, problem.seqlen_q), dtype=torch.float32, device=q.device
    )
    if problem.seqlen_k == 0:
        # Softmax over no keys: the empty sum gives lse = -inf and a zero output.
        out.zero_()
        lse.fill_(-torch.inf)
    elif q.numel() > 0:
        # Imported here: both pull in the CuTe DSL, which `import attnlab` must not pay for.
        from attnlab import dispatch, runtime

        arch = dispatch.arch_of(q.device)
        if config is None:
            config = dispatch.default_config(arch, problem)
        config.check_problem(problem.head_dim, arch)
        runtime.launch_forward(q, k, v, out, lse, problem.softmax_scale, config)
    if return_lse:
        return out, lse
    return out
