"""``attnlab.gemm.matmul``: ``a @ b`` for fp16/bf16 matrices on the sm_90a HGEMM.

A call looks its *call signature* (shapes, strides, dtypes, device, options) up in a memo; the
first call of a signature validates, plans (``dispatch.plan``: tile, split-K, grid) and loads
the kernels, later calls check the data pointers' alignment, allocate and launch. Inputs the
kernel cannot take are refused here with the reason, never passed on.
"""

from __future__ import annotations

import math

import torch

from attnlab import device, kernel_cache
from attnlab.counters import tile_counters
from attnlab.gemm.dispatch import Plan, plan
from attnlab.gemm_config import GemmConfig, element_bytes
from attnlab.kernels.gemm.abi import GEMM_ALIGN_BYTES, GemmSpec, ReduceSpec, binary_config
from attnlab.memo import remember
from attnlab.validation import wants_grad

#: Largest split-K partials a call signature keeps between calls (per stream).
SCRATCH_BYTES = 32 << 20

#: The architectures the HGEMM is built for.
GEMM_ARCHS = ("sm_90a",)
_IN_DTYPES = (torch.float16, torch.bfloat16)
_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_calls: dict[tuple, _GemmCall] = {}
#: The epilogue's arguments of a plain GEMM: no INT8 scales or zero points, no bias; and A
#: dense (no 2:4 metadata).
NO_EPILOGUE = (None, None, None, None, None)


def matmul(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None,
           config: GemmConfig | None = None) -> torch.Tensor:
    """``a @ b`` with fp32 accumulation.

    Args:
        a: ``[M, K]``, fp16 or bf16, on an sm_90 GPU (H100/H200). Row-major, or a transposed
            view (column-major); its other stride a multiple of 16 bytes.
        b: ``[K, N]``, a's dtype and device; row-major, or a transposed ``[N, K]`` weight
            (``w.t()``, as ``torch.nn.functional.linear`` holds it).
        out_dtype: C's dtype: a's (default), the other 16-bit type, or ``torch.float32``.
        config: the kernel's tile and schedule (``GemmConfig``); default: chosen per shape,
            split-K included (``attnlab.gemm.dispatch``).

    Returns:
        ``[M, N]`` in ``out_dtype``, contiguous.

    Raises:
        RuntimeError: an input requires grad (no backward pass).
        TypeError: not tensors, unsupported dtypes, or a config of the wrong type.
        ValueError: shapes that do not multiply, strides or addresses the TMA unit cannot
            read (a stride or base not a multiple of 16 bytes), other devices.
        NotImplementedError: a GPU other than sm_90.
    """
    refuse_autograd(a, b)
    out_dtype = a.dtype if out_dtype is None and isinstance(a, torch.Tensor) else out_dtype
    try:
        key = (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device,
               out_dtype, config)
        call = _calls.get(key)
    except (AttributeError, TypeError):
        key, call = None, None
    if call is None:
        call = _GemmCall(a, b, out_dtype, config)
        if key is not None:
            remember(_calls, key, call)
    return call(a, b)


def refuse_autograd(*tensors: object) -> None:
    """The GEMMs have no backward: an input that requires grad (with grad mode on) would get a
    result silently cut from the graph, so it is refused."""
    if wants_grad(*tensors):
        raise RuntimeError("attnlab.gemm has no backward pass: an input requires grad. Use "
                           "torch.matmul for training, or call under torch.no_grad()")


def _check(a: object, b: object, out_dtype: object, config: object,
           in_dtypes: tuple[torch.dtype, ...] = _IN_DTYPES) -> None:
    """Types, ranks, dtypes, shapes, devices and options of a GEMM's operands (what needs no
    GPU); the layout and address rules are ``operand_major``'s and the call's."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D matrix, got shape {tuple(t.shape)}")
        if t.dtype not in in_dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in in_dtypes)
            raise TypeError(f"{name} has dtype {t.dtype}; supported: {names}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must share one dtype, got {a.dtype} and {b.dtype}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a @ b needs a's columns to match b's rows: a is "
                         f"{tuple(a.shape)}, b is {tuple(b.shape)}")
    for name, t in (("a", a), ("b", b)):
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
    if a.device != b.device:
        raise ValueError(f"a and b must be on one device, got {a.device} and {b.device}")
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.float16, torch.bfloat16 or torch.float32, "
                        f"got {out_dtype}")
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"config must be an attnlab.gemm.GemmConfig, got "
                        f"{type(config).__name__}")


def operand_major(name: str, t: torch.Tensor, labels: tuple[str, str]) -> tuple[str, torch.Tensor]:
    """``(label, view)``: which mode of matrix ``t`` is contiguous (``labels[1]`` for its
    columns, ``labels[0]`` for its rows) and a view whose strides the kernel takes (a mode of
    size 1 gets whatever stride the rule asks: it is never stepped along).

    Raises:
        ValueError: neither mode is contiguous with the other's stride a multiple of 16 bytes.
    """
    align = GEMM_ALIGN_BYTES // t.element_size()
    for unit in (1, 0):
        other = 1 - unit
        if t.shape[unit] != 1 and t.stride(unit) != 1:
            continue
        if t.shape[other] != 1 and t.stride(other) % align:
            continue
        strides = [0, 0]
        strides[unit] = 1
        strides[other] = (t.stride(other) if t.shape[other] != 1
                          else align * math.ceil(t.shape[unit] / align))
        view = t if tuple(strides) == t.stride() else t.as_strided(t.shape, strides)
        return labels[unit], view
    raise ValueError(
        f"{name} (shape {tuple(t.shape)}, strides {t.stride()}) needs one contiguous mode and "
        f"the other's stride a multiple of {align} elements ({GEMM_ALIGN_BYTES} bytes, what "
        f"the TMA unit reads); pad the matrix (e.g. to a multiple of {align} columns) or "
        f"make it contiguous")


class _GemmCall:
    """One call signature's GEMM: its plan and kernels (built once); a call allocates C
    (and the split-K workspace) and launches."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype,
                 config: GemmConfig | None):
        _check(a, b, out_dtype, config)
        info = device.info(a.device)
        if info.arch not in GEMM_ARCHS:
            raise NotImplementedError(f"attnlab.gemm.matmul runs on sm_90 (H100/H200); "
                                      f"{info.name} is {info.arch}")
        self.a_major, a_view = operand_major("a", a, ("m", "k"))
        self.b_major, b_view = operand_major("b", b, ("k", "n"))
        # Views are rebuilt per call only where a size-1 mode's stride had to be replaced.
        self.restride = a_view is not a or b_view is not b
        (self.m, self.k), self.n = a.shape, b.shape[1]
        self.out_dtype = out_dtype
        out_name = str(out_dtype).removeprefix("torch.")
        check_c_rows(self.n, out_name)
        self.empty = self.m == 0 or self.n == 0 or self.k == 0
        if self.empty:
            return
        dtype = str(a.dtype).removeprefix("torch.")
        config = config or tuned(info, dtype, out_name, self.m, self.n, self.k)
        self.plan: Plan = plan(self.m, self.n, self.k, info.multiprocessors, config,
                               in_dtype=dtype, out_dtype=out_name)
        kernel_out = out_name if self.plan.split in ("none", "serial", "cluster") else "float32"
        spec = GemmSpec(binary_config(self.plan.config), info.arch, dtype, kernel_out,
                        self.a_major, self.b_major, self.plan.split)
        self.gemm = kernel_cache.get(spec).fn
        cfg = self.plan.config
        self.counters = (math.ceil(self.m / cfg.block_m) * math.ceil(self.n / cfg.block_n)
                         * cfg.num_consumers)
        self._scratch: dict[int, torch.Tensor] = {}
        self.reduce = None
        if self.plan.split == "workspace" or (self.plan.split == "atomic"
                                              and out_dtype != torch.float32):
            self.reduce = kernel_cache.get(ReduceSpec(info.arch, out_name)).fn

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.empty:
            return torch.zeros((self.m, self.n), dtype=self.out_dtype, device=a.device)
        if self.restride:
            _, a = operand_major("a", a, ("m", "k"))
            _, b = operand_major("b", b, ("k", "n"))
        if (a.data_ptr() | b.data_ptr()) % GEMM_ALIGN_BYTES:
            name = "a" if a.data_ptr() % GEMM_ALIGN_BYTES else "b"
            raise ValueError(f"{name}'s data must start on a {GEMM_ALIGN_BYTES}-byte "
                             f"boundary (a view at an odd offset is not); clone it")
        p = self.plan
        shape = (self.m, self.n)
        if p.split in ("none", "cluster"):
            c = torch.empty(shape, dtype=self.out_dtype, device=a.device)
            self.gemm(a, b, c, None, None, *NO_EPILOGUE, p.splits, p.num_ctas)
            return c
        if p.split == "serial":
            c = torch.empty(shape, dtype=self.out_dtype, device=a.device)
            self.gemm(a, b, c, self._partials(a), tile_counters(a.device, self.counters),
                      *NO_EPILOGUE, p.splits, p.num_ctas)
            return c
        if p.split == "workspace":
            partials = self._partials(a)
            self.gemm(a, b, partials, None, None, *NO_EPILOGUE, p.splits, p.num_ctas)
        else:
            partials = torch.zeros(shape, dtype=torch.float32, device=a.device)
            self.gemm(a, b, partials, None, None, *NO_EPILOGUE, p.splits, p.num_ctas)
            if self.reduce is None:
                return partials
            partials = partials[None]
        c = torch.empty(shape, dtype=self.out_dtype, device=a.device)
        self.reduce(partials, c)
        return c

    def _partials(self, a: torch.Tensor) -> torch.Tensor:
        return split_partials(self._scratch, a.device, (self.plan.splits, self.m, self.n))


def split_partials(cache: dict[int, torch.Tensor], dev: torch.device,
                   shape: tuple[int, ...]) -> torch.Tensor:
    """The K slices' fp32 partials of a split GEMM or convolution: kept in ``cache`` per
    stream (``device.per_stream``; the slices' meeting or the reduce reads them within the
    call) up to ``SCRATCH_BYTES``, larger ones allocated per call (their GEMMs take far longer
    than an allocation)."""
    if 4 * math.prod(shape) > SCRATCH_BYTES:
        return torch.empty(shape, dtype=torch.float32, device=dev)
    return device.per_stream(cache, dev, lambda: torch.empty(shape, dtype=torch.float32,
                                                             device=dev))


def tuned(info: device.DeviceInfo, dtype: str, out_dtype: str, m: int, n: int, k: int
          ) -> GemmConfig | None:
    """``attnlab tune --family gemm``'s config for this GEMM on this GPU, if it wrote one."""
    from attnlab.dispatch import tune_cache
    from attnlab.gemm.tune import gemm_key, tuned_config

    return tuned_config(tune_cache(), gemm_key(info, dtype, out_dtype, m, n, k))


def check_c_rows(n: int, dtype_name: str) -> None:
    """Refuse an output the TMA unit cannot write: rows of ``n`` values of ``dtype_name``
    that are not a whole number of 16-byte units (ValueError)."""
    if n * element_bytes(dtype_name) % GEMM_ALIGN_BYTES:
        raise ValueError(f"C's rows ({n} x {dtype_name}) must be a multiple of "
                         f"{GEMM_ALIGN_BYTES} bytes (the TMA unit's stride rule); pad N")


def forget_calls() -> None:
    """Drop every remembered call signature, the 2:4 sparse product's too."""
    from attnlab.gemm import sparse

    _calls.clear()
    sparse.forget()
