"""The user-facing entry points: validate once per call signature, then launch.

An eager call looks its signature up (the metadata of its tensors and the values of its
options) in a memo. The first call of a signature runs the full validation
(:mod:`attnlab.validation`, which explains every refusal), chooses the config and gets the
compiled kernel (:mod:`attnlab.runtime`); every later call with that signature only checks
the data pointers, allocates the outputs and launches. Validation reads nothing but that
metadata, so its verdict holds for every call that shares it.

Under torch.compile the functions trace through validation to the forward custom ops
(:mod:`attnlab.ops`), whose real implementation launches the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attnlab import memo, ops, runtime
from attnlab.config import FlashConfig
from attnlab.validation import (
    COPY_ALIGN_BYTES,
    FULL_WINDOW,
    Problem,
    check_cu_seqlens_values,
    check_data_pointers,
    check_inputs,
    check_varlen_inputs,
)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = FULL_WINDOW,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    config: FlashConfig | None = None,
    deterministic: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention ``softmax(scale * Q K^T + mask) V`` on the GPU (FlashAttention-2), with its
    gradient.

    Args:
        q: ``[B, Sq, Hq, D]`` CUDA tensor, float16 or bfloat16.
        k, v: ``[B, Sk, Hkv, D]``, same dtype and device as ``q``. ``Sk`` may differ from
            ``Sq``. ``Hkv`` must divide ``Hq`` (GQA; ``Hkv == 1`` is MQA): q head ``h`` reads
            k/v head ``h // (Hq // Hkv)``, in place, without copies. ``D`` must be one of
            ``attnlab.config.SUPPORTED_HEAD_DIMS``. Each tensor must be contiguous in its last
            dim, start on a 16-byte boundary and have strides of dims 0..2 that are multiples
            of 8 elements; ``.contiguous()`` satisfies all three.
        softmax_scale: multiplier of QK^T; ``None`` means ``1/sqrt(D)``. Any finite positive
            real number.
        causal: mask the keys after each row's diagonal, aligned to the bottom-right corner
            when ``Sq != Sk`` (FlashAttention-2's convention: row ``i`` sees keys
            ``j <= i + Sk - Sq``; with ``Sq > Sk`` the first ``Sq - Sk`` rows see none). Sets
            ``window_size``'s right side to 0 and keeps its left side, as flash_attn does.
        window_size: ``(left, right)`` sliding window: row ``i`` sees keys
            ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``; -1 leaves a side unbounded.
        return_lse: also return the natural-log log-sum-exp of each row of scaled scores.
        out: write the result into this tensor (q's shape, dtype and device; any layout that
            q could have; not overlapping q, k or v) and return it. Works under torch.compile
            (through a mutating custom op) and CUDA graphs.
        config: the kernel configuration; ``None`` picks the default for the GPU and problem
            at launch time.
        deterministic: make the backward's dQ bitwise repeatable (its K/V blocks add their
            parts in a fixed order instead of as they finish; slower).

    Differentiable (eager and under torch.compile) with respect to q, k and v, through
    ``out`` and ``lse``, at every head dim (but 256 on sm_86/89, whose shared memory holds
    no such tile: ``attnlab.backward_config.backward_head_dims``; a backward beyond them
    raises attnlab.ConfigError). A call with ``out=`` is not differentiable.

    Returns:
        ``out`` (a new contiguous ``[B, Sq, Hq, D]`` tensor in q's dtype unless one was given),
        or ``(out, lse)`` with ``lse`` a new float32 ``[B, Hq, Sq]`` tensor. A row that sees no
        key (``Sk == 0``, or masked out entirely) gets ``out`` 0 and ``lse`` -inf, as in
        :func:`attnlab.reference.attention`. With ``B``, ``Sq``, ``Hq`` or ``Sk`` zero no
        kernel runs.

    Raises:
        TypeError: ``config`` is neither None nor a FlashConfig; a non-tensor input; an
            unsupported or mismatched dtype; a softmax_scale, causal or window_size of the wrong
            type. The config type is checked first: a wrong-typed config is a mistake whatever
            the tensors.
        ValueError: bad rank, shapes, heads, head dim, layout, softmax_scale, window or out;
            tensors not on CUDA or not on one device (see
            :func:`attnlab.validation.check_inputs`).
        attnlab.ConfigError: (a ValueError) the config cannot serve this head dim on this GPU,
            e.g. its tiles overflow shared memory.
    """
    options = (softmax_scale, causal, window_size, config, deterministic)
    if torch.compiler.is_compiling():
        return _traced(q, k, v, None, None, None, None, options, return_lse, out)
    key, call = _lookup(lambda: (
        q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
        v.shape, v.stride(), v.dtype, v.device, options, return_lse,
        None if out is None else (out.shape, out.stride(), out.dtype, out.device)))
    if call is None:
        _check_config_type(config)
        problem = check_inputs(q, k, v, softmax_scale=softmax_scale, causal=causal,
                               window_size=window_size, out=out, check_pointers=False)
        call = _new_call(key, q, k, v, out, problem, options, return_lse, None, None)
    return call(q, k, v, out)


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = FULL_WINDOW,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    config: FlashConfig | None = None,
    check_cu_seqlens: bool = False,
    deterministic: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention` over a batch of sequences of different lengths, packed without padding.

    The arguments of flash_attn's ``flash_attn_varlen_func``: sequence ``b`` is rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q and ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` of
    k and v. Causal alignment and windows apply within each sequence, with its own lengths;
    sequences may be empty.

    Args:
        q: ``[total_q, Hq, D]``; k, v: ``[total_k, Hkv, D]``. Rules as :func:`attention`, with
            strides of dims 0..1 multiples of 8 elements.
        cu_seqlens_q, cu_seqlens_k: int32, 1-D, contiguous CUDA tensors of ``B + 1`` offsets:
            starting at 0, non-decreasing, ending at ``total_q`` / ``total_k``.
        max_seqlen_q, max_seqlen_k: ints, at least the longest sequence of q / of k and v.
        check_cu_seqlens: verify the offsets' values and the max lengths first. That copies
            the offsets to the host, a synchronisation that CUDA-graph capture forbids and
            torch.compile cannot trace, so it is off by default: the kernel trusts the offsets,
            and wrong ones give wrong results or out-of-bounds reads.
        The rest: as :func:`attention`.

    Returns:
        ``out`` (``[total_q, Hq, D]``), or ``(out, lse)`` with ``lse`` a float32
        ``[Hq, total_q]`` tensor (flash_attn_varlen_func's layout).

    Raises:
        TypeError, ValueError, attnlab.ConfigError: as :func:`attention`, and for bad offsets
            or max lengths (see :func:`attnlab.validation.check_varlen_inputs`).
    """
    options = (softmax_scale, causal, window_size, config, deterministic)
    if torch.compiler.is_compiling():
        return _traced(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                       options, return_lse, out, check_cu_seqlens)
    key, call = _lookup(lambda: (
        q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
        v.shape, v.stride(), v.dtype, v.device, cu_seqlens_q.shape, cu_seqlens_q.stride(),
        cu_seqlens_q.dtype, cu_seqlens_q.device, cu_seqlens_k.shape, cu_seqlens_k.stride(),
        cu_seqlens_k.dtype, cu_seqlens_k.device, max_seqlen_q, max_seqlen_k, options,
        return_lse, None if out is None else (out.shape, out.stride(), out.dtype, out.device)))
    if call is None:
        _check_config_type(config)
        problem = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                      max_seqlen_k, softmax_scale=softmax_scale,
                                      causal=causal, window_size=window_size, out=out,
                                      check_pointers=False)
        call = _new_call(key, q, k, v, out, problem, options, return_lse, max_seqlen_q,
                         max_seqlen_k)
    if check_cu_seqlens:
        check_cu_seqlens_values(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                                max_seqlen_q, max_seqlen_k)
    return call(q, k, v, out, cu_seqlens_q, cu_seqlens_k)


def _check_config_type(config: object) -> None:
    if config is not None and not isinstance(config, FlashConfig):
        raise TypeError(
            f"config must be an attnlab.FlashConfig or None, got {type(config).__name__} "
            f"{config!r}"
        )


class _EagerCall:
    """What an eager call of one signature does after validation: allocate, launch, return;
    or, when autograd has to record it, the same through ``ops.EagerAttention`` (with the
    LSE, which the backward needs: ``grad_launch``, built at the first such call)."""

    __slots__ = ("launch", "out_shape", "lse_shape", "dtype", "device", "return_lse",
                 "op_args", "problem", "config", "grad_launch")

    def __init__(self, launch: runtime.Launch, q: torch.Tensor, problem: Problem,
                 config: FlashConfig | None, return_lse: bool, op_args: tuple):
        self.launch = launch
        self.out_shape = q.shape
        self.lse_shape = ops.lse_shape(q, problem.varlen)
        self.dtype = q.dtype
        self.device = q.device
        self.return_lse = return_lse
        self.op_args = op_args
        self.problem = problem
        self.config = config
        self.grad_launch = launch if return_lse else None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor | None, cu_seqlens_q: torch.Tensor | None = None,
                 cu_seqlens_k: torch.Tensor | None = None
                 ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            if out is not None:
                raise RuntimeError(ops.NO_OUT_BACKWARD)
            out, lse = ops.EagerAttention.apply(q, k, v, self, cu_seqlens_q, cu_seqlens_k)
            return (out, lse) if self.return_lse else out
        if out is None:
            # Addresses are the one thing validation could not see: check them per call.
            if (q.data_ptr() | k.data_ptr() | v.data_ptr()) % COPY_ALIGN_BYTES:
                check_data_pointers(q, k, v)
            out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        else:
            check_data_pointers(q, k, v, out)
        lse = None
        if self.return_lse:
            lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        self.launch(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        return (out, lse) if self.return_lse else out

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """A new ``(out, lse)`` (the LSE whatever ``return_lse``: the backward needs it)."""
        if (q.data_ptr() | k.data_ptr() | v.data_ptr()) % COPY_ALIGN_BYTES:
            check_data_pointers(q, k, v)
        if self.grad_launch is None:
            self.grad_launch = runtime.launch_for(q, k, v, None, self.problem, self.config,
                                                  with_lse=True)
        out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        self.grad_launch(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        return out, lse


_calls: dict[tuple, _EagerCall] = {}


def _lookup(signature: Callable[[], tuple]) -> tuple[tuple | None, _EagerCall | None]:
    """``(key, remembered call or None)`` of a call signature; ``(None, None)`` when the
    signature cannot be built or hashed (options that are lists, arguments that are not
    tensors): such calls take the slow path, whose validation explains what is wrong."""
    try:
        key = signature()
        return key, _calls.get(key)
    except (TypeError, AttributeError):
        return None, None


def _new_call(key: tuple | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor | None, problem: Problem, options: tuple, return_lse: bool,
              max_seqlen_q: int | None, max_seqlen_k: int | None) -> _EagerCall:
    """The call of a validated signature, remembered under ``key`` (unless None)."""
    config, deterministic = options[3], options[4]
    call = _EagerCall(runtime.launch_for(q, k, v, out, problem, config, return_lse), q,
                      problem, config, return_lse,
                      _op_args(problem, config, deterministic, max_seqlen_q, max_seqlen_k))
    if key is not None:
        memo.remember(_calls, key, call)
    return call


def _op_args(problem: Problem, config: FlashConfig | None, deterministic: bool,
             max_seqlen_q: int | None, max_seqlen_k: int | None) -> tuple:
    """``attention_fwd``'s arguments after q, k, v and the offsets."""
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    return (max_seqlen_q, max_seqlen_k, problem.softmax_scale, *problem.window,
            *ops.encode_config(config), deterministic)


def forget_calls() -> None:
    """Forget every call signature (their configs are chosen again at the next call)."""
    from attnlab import backward

    _calls.clear()
    runtime.forget()
    backward.forget()


def _traced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None,
            max_seqlen_q: int | None, max_seqlen_k: int | None, options: tuple,
            return_lse: bool, out: torch.Tensor | None, check_cu_seqlens: bool = False) -> Any:
    """The torch.compile path: validate while tracing, then the forward custom op (the
    mutating one when the caller gave ``out``)."""
    softmax_scale, causal, window_size, config, deterministic = options
    _check_config_type(config)
    common = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                  out=out, check_pointers=False)
    if cu_seqlens_q is None:
        problem = check_inputs(q, k, v, **common)
    else:
        if check_cu_seqlens:
            raise ValueError("check_cu_seqlens=True reads the offsets on the host, which "
                             "torch.compile cannot trace; check them before the compiled call")
        problem = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                      max_seqlen_k, **common)
    args = (cu_seqlens_q, cu_seqlens_k,
            *_op_args(problem, config, deterministic, max_seqlen_q, max_seqlen_k))
    if out is None:
        out, lse = ops.attention_fwd(q, k, v, *args)
    else:
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            raise RuntimeError(ops.NO_OUT_BACKWARD)
        lse = ops.attention_fwd_out(q, k, v, out, *args[:-1])
    return (out, lse) if return_lse else out
