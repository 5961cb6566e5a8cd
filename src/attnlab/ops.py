"""The forward and backward passes as torch custom ops, so torch.compile traces them (and keeps
them in the compiled graph, backward included) and CUDA graphs capture them.

Two ops, each taking dense (BSHD) and packed varlen inputs alike, as
:func:`attnlab.runtime.forward` does (the ``cu_seqlens`` are None for dense):

* ``attnlab::attention_fwd`` returns a new ``(out, lse)``; ``attention()`` uses it when the
  caller gives no ``out``.
* ``attnlab::attention_fwd_out`` writes the caller's ``out`` (declared mutated) and returns
  ``lse``.

``attnlab::attention_fwd`` is differentiable: its autograd formula (``torch.library.
register_autograd``) saves q, k, v, out and lse and calls ``attnlab::attention_bwd``
(:func:`attnlab.backward.attention_backward`); that is what a compiled graph records. An eager
call whose inputs require grad skips the custom op's dispatch: ``EagerAttention`` wraps the
memoised forward launch and the same backward. The mutating op is not differentiable, as
torch's own ``out=`` functions are not.

Their fake (meta) implementations allocate exactly what the real ones do, so torch.compile
sees the right shapes, dtypes and strides without running a kernel. The real implementation is
safe inside CUDA-graph capture: it reads only host-side metadata and data pointers, never
tensor values, and allocates nothing but ``out`` and ``lse``.

A FlashConfig cannot cross the op boundary, so it travels as its fields: the int and bool ones
as a list of ints, which torch.compile may make symbolic (it does once a call site recompiles
for a second config), the str ones joined into one string, which it keeps constant. An empty
list and string stand for "no config": the op asks dispatch for the default at launch, where
the tuning cache can be read (torch.compile cannot trace the file read).
"""

from __future__ import annotations

import dataclasses

import torch

from attnlab import runtime
from attnlab.config import FlashConfig

#: Joins the str fields of a config; no field value contains it.
_STR_SEPARATOR = ","


def encode_config(config: FlashConfig | None) -> tuple[list[int], str]:
    """A config as custom-op arguments: (int and bool fields as ints, str fields joined)."""
    if config is None:
        return [], ""
    ints: list[int] = []
    strs: list[str] = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if _is_str_field(field):
            strs.append(value)
        else:
            ints.append(int(value))
    return ints, _STR_SEPARATOR.join(strs)


def decode_config(ints: list[int], strs: str) -> FlashConfig | None:
    """The config :func:`encode_config` encoded (None for none)."""
    if not ints and not strs:
        return None
    int_values = iter(ints)
    str_values = iter(strs.split(_STR_SEPARATOR))
    values: dict[str, object] = {}
    for field in dataclasses.fields(FlashConfig):
        if _is_str_field(field):
            values[field.name] = next(str_values)
        elif isinstance(field.default, bool):
            values[field.name] = bool(next(int_values))
        else:
            values[field.name] = next(int_values)
    return FlashConfig(**values)  # type: ignore[arg-type]


def _is_str_field(field: dataclasses.Field) -> bool:
    # Every FlashConfig field has a default (FlashConfig() is the kernel's baseline), and its
    # type is the field's: annotations are strings here, defaults are not.
    return isinstance(field.default, str)


def new_out(q: torch.Tensor) -> torch.Tensor:
    """The output the op allocates: dense, q's shape and dtype, even when q is a strided view."""
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def lse_shape(q: torch.Tensor, varlen: bool) -> tuple[int, ...]:
    """The log-sum-exp's shape: ``[B, Hq, Sq]`` dense, ``[Hq, total_q]`` varlen (flash_attn's
    layouts)."""
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def new_lse(q: torch.Tensor, varlen: bool) -> torch.Tensor:
    """A new fp32 log-sum-exp for ``q`` (:func:`lse_shape`)."""
    return torch.empty(lse_shape(q, varlen), dtype=torch.float32, device=q.device)


# --------------------------------------------------------------------------------------------
@torch.library.custom_op("attnlab::attention_fwd", mutates_args=())
def attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    config_ints: list[int],
    config_strs: str,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward attention on validated inputs into new ``(out, lse)``; see the module docstring.
    ``deterministic`` is for the backward (its dQ sums in a fixed order)."""
    out, lse = new_out(q), new_lse(q, varlen=cu_seqlens_q is not None)
    _forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
             softmax_scale, window_left, window_right, config_ints, config_strs)
    return out, lse


@attention_fwd.register_fake
def _attention_fwd_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        cu_seqlens_q: torch.Tensor | None, *_: object
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    # Shapes depend only on q and on whether the batch is packed.
    return new_out(q), new_lse(q, varlen=cu_seqlens_q is not None)


@torch.library.custom_op("attnlab::attention_fwd_out", mutates_args=("out",))
def attention_fwd_out(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    config_ints: list[int],
    config_strs: str,
) -> torch.Tensor:
    """Forward attention on validated inputs into the caller's ``out``; returns a new ``lse``."""
    lse = new_lse(q, varlen=cu_seqlens_q is not None)
    _forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
             softmax_scale, window_left, window_right, config_ints, config_strs)
    return lse


@attention_fwd_out.register_fake
def _attention_fwd_out_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            out: torch.Tensor, cu_seqlens_q: torch.Tensor | None, *_: object
                            ) -> torch.Tensor:
    return new_lse(q, varlen=cu_seqlens_q is not None)


@torch.library.custom_op("attnlab::attention_bwd", mutates_args=())
def attention_bwd(
    dout: torch.Tensor,
    dlse: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of one ``attention_fwd`` call (:func:`attnlab.backward.
    attention_backward`)."""
    from attnlab.backward import attention_backward

    return attention_backward(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q, max_seqlen_k, softmax_scale,
                              (window_left, window_right), deterministic)


@attention_bwd.register_fake
def _attention_bwd_fake(dout: torch.Tensor, dlse: torch.Tensor | None, q: torch.Tensor,
                        k: torch.Tensor, v: torch.Tensor, *_: object
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return new_out(q), new_out(k), new_out(v)


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k, scale, left, right, _, _, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, scale, left, right, deterministic)


def _backward(ctx, dout: torch.Tensor, dlse: torch.Tensor | None) -> tuple:
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = attention_bwd(dout, dlse, q, k, v, out, lse, cu_q, cu_k, *ctx.args)
    return (dq, dk, dv) + (None,) * 10


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


class EagerAttention(torch.autograd.Function):
    """The eager training path: ``call``'s memoised forward launch, and the backward, without
    the custom op's dispatch on either side (its host cost showed in training steps at seq 2k);
    ``torch.compile`` keeps ``attention_fwd`` and its registered formula. Both end in
    ``backward.attention_backward``."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call,
                cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = call.run(q, k, v, cu_seqlens_q, cu_seqlens_k)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.args = call.op_args
        # An output the loss does not use has no gradient (not a tensor of zeros).
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout: torch.Tensor | None, dlse: torch.Tensor | None) -> tuple:
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        max_q, max_k, scale, left, right, *_, deterministic = ctx.args
        from attnlab.backward import attention_backward

        return (*attention_backward(dout, q, k, v, out, lse, dlse, cu_q, cu_k, max_q, max_k,
                                    scale, (left, right), deterministic),
                None, None, None)


#: Why a call that writes the caller's ``out`` has no gradient.
NO_OUT_BACKWARD = ("attnlab attention with out= is not differentiable (as torch's out= "
                   "functions are not): call it without out= to train, or under "
                   "torch.no_grad() / on detached inputs")


# --------------------------------------------------------------------------------------------
def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    config_ints: list[int],
    config_strs: str,
) -> None:
    """The ops' body: decode the config, then launch (``runtime.forward``)."""
    runtime.forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    softmax_scale, (window_left, window_right),
                    decode_config(config_ints, config_strs))
