"""Occupancy: how many CTAs of a kernel fit on one SM, which resource binds, where the cliffs are.

The model is the CUDA occupancy calculator's for sm_80 and later:

* registers are allocated per warp, ``regs_per_thread * 32`` rounded up to 256, out of four
  register-file partitions of ``regs_per_sm / 4`` (one per warp scheduler);
* shared memory is allocated per CTA in 128-byte units, and the driver reserves 1 KiB per CTA
  on top of what the kernel asks for (``cudaDevAttrReservedSharedMemoryPerBlock``). That
  reservation is why GA104's "50 KB cliff" (seed 004) sits at 49 KiB of kernel shared memory:
  two CTAs need 2 x (49 + 1) KiB = 100 KiB, all an SM has;
* warps (threads) and CTA slots per SM are hard limits.

``occupancy`` reports every limit, the binding one(s), and the next cliff: how far registers
or shared memory must drop to fit one more CTA, and how far they can grow before one is lost.

Checked against the driver: for two of our sm_90a kernels (190 and 255 registers) on an H200,
``cuOccupancyMaxActiveBlocksPerMultiprocessor`` agreed with ``occupancy`` in all 9090 cases
tried (block sizes 32, 64, 96, 128 and 256 x dynamic shared memory of k KiB - 1, k KiB,
k KiB + 1 and k KiB + 512 bytes up to the opt-in maximum), and ``current_device_spec()``
equalled the H200 entry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class GpuSpec:
    """Per-SM limits of one GPU (what the occupancy calculation needs)."""

    name: str
    arch: str
    sms: int
    max_threads_per_sm: int
    max_ctas_per_sm: int
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    max_regs_per_cta: int = 65536
    max_threads_per_cta: int = 1024
    smem_per_sm: int = 0
    smem_per_cta_optin: int = 0
    smem_reserved_per_cta: int = 1 * KIB
    smem_alloc_unit: int = 128
    reg_alloc_unit: int = 256  # registers, per warp
    register_partitions: int = 4

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // 32

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self) | {"max_warps_per_sm": self.max_warps_per_sm}


_AMPERE_GA10X = dict(arch="sm_86", max_threads_per_sm=1536, max_ctas_per_sm=16,
                     smem_per_sm=100 * KIB, smem_per_cta_optin=99 * KIB)
_HOPPER = dict(arch="sm_90", sms=132, max_threads_per_sm=2048, max_ctas_per_sm=32,
               smem_per_sm=228 * KIB, smem_per_cta_optin=227 * KIB)

#: Built-in specs (CUDA programming guide, compute-capability tables; SM counts per product).
GPU_SPECS: dict[str, GpuSpec] = {
    "A100": GpuSpec("A100", arch="sm_80", sms=108, max_threads_per_sm=2048, max_ctas_per_sm=32,
                    smem_per_sm=164 * KIB, smem_per_cta_optin=163 * KIB),
    "RTX3090": GpuSpec("RTX 3090", sms=82, **_AMPERE_GA10X),
    # Seed 004's GA104 lab GPU (it reports 48 SMs).
    "RTX3070Ti": GpuSpec("RTX 3070 Ti (GA104)", sms=48, **_AMPERE_GA10X),
    "H100": GpuSpec("H100 SXM", **_HOPPER),
    "H200": GpuSpec("H200", **_HOPPER),
}
_ALIASES = {"GA104": "RTX3070Ti", "RTX3070TILAPTOP": "RTX3070Ti", "H100SXM": "H100"}


def _key(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


def get_spec(name: str) -> GpuSpec:
    """A built-in spec by name, forgiving case, spaces and dashes (``"rtx 3090"``, ``"ga104"``),
    or ``"current"`` for the GPU torch sees."""
    if _key(name) == "CURRENT":
        spec = current_device_spec()
        if spec is None:
            raise KeyError("no CUDA GPU here for 'current' (torch.cuda.is_available() is False)")
        return spec
    by_key = {_key(k): k for k in GPU_SPECS}
    key = _key(name)
    key = _ALIASES.get(key, by_key.get(key))
    if key is None:
        raise KeyError(f"unknown GPU {name!r}; known: {', '.join(GPU_SPECS)}, current")
    return GPU_SPECS[key]


#: Max resident CTAs per SM by compute capability (not among torch's device properties).
MAX_CTAS_PER_SM = {(8, 0): 32, (8, 6): 16, (8, 7): 16, (8, 9): 24, (9, 0): 32, (10, 0): 32}


def spec_from_properties(props: object) -> GpuSpec:
    """A spec from ``torch.cuda.get_device_properties`` (older torch lacks some fields: those
    fall back to the values shared by every sm_80+ part)."""
    cc = (props.major, props.minor)  # type: ignore[attr-defined]
    smem_per_sm = props.shared_memory_per_multiprocessor  # type: ignore[attr-defined]
    return GpuSpec(
        name=props.name,  # type: ignore[attr-defined]
        arch=f"sm_{cc[0]}{cc[1]}",
        sms=props.multi_processor_count,  # type: ignore[attr-defined]
        max_threads_per_sm=props.max_threads_per_multi_processor,  # type: ignore[attr-defined]
        max_ctas_per_sm=MAX_CTAS_PER_SM.get(cc, 16),
        regs_per_sm=getattr(props, "regs_per_multiprocessor", 65536),
        smem_per_sm=smem_per_sm,
        smem_per_cta_optin=getattr(props, "shared_memory_per_block_optin", smem_per_sm - KIB),
    )


def current_device_spec() -> GpuSpec | None:
    """The spec of the current CUDA device, or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    return spec_from_properties(torch.cuda.get_device_properties(torch.cuda.current_device()))


# ---------------------------------------------------------------------------------------------
def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def ctas_by_registers(spec: GpuSpec, threads_per_cta: int, regs_per_thread: int) -> int:
    """CTAs per SM the register file allows."""
    warps = -(-threads_per_cta // 32)
    if regs_per_thread > spec.max_regs_per_thread:
        return 0
    regs_per_warp = _round_up(max(regs_per_thread, 1) * 32, spec.reg_alloc_unit)
    if regs_per_warp * warps > spec.max_regs_per_cta:
        return 0
    per_partition = spec.regs_per_sm // spec.register_partitions // regs_per_warp
    return per_partition * spec.register_partitions // warps


def ctas_by_shared_memory(spec: GpuSpec, smem_per_cta: int) -> int:
    """CTAs per SM shared memory allows (with the per-CTA reservation)."""
    if smem_per_cta > spec.smem_per_cta_optin:
        return 0
    per_cta = _round_up(smem_per_cta + spec.smem_reserved_per_cta, spec.smem_alloc_unit)
    return spec.smem_per_sm // per_cta


def _limits(spec: GpuSpec, threads: int, regs: int, smem: int) -> dict[str, int]:
    warps = -(-threads // 32)
    fits = threads <= spec.max_threads_per_cta
    return {
        "registers": ctas_by_registers(spec, threads, regs),
        "shared_memory": ctas_by_shared_memory(spec, smem),
        "warps": spec.max_warps_per_sm // warps if fits else 0,
        "cta_slots": spec.max_ctas_per_sm,
    }


def _amount(value: int, unit: str) -> str:
    if unit == "bytes/CTA" and value % KIB == 0:
        return f"{value // KIB} KiB/CTA"
    return f"{value} {unit}"


@dataclass(frozen=True)
class Cliff:
    """How one resource must change for the CTA count to move by one.

    ``gain``: the largest usage that fits one more CTA, if the other adjustable resource
    named in ``also`` drops as far as needed too (None when this resource is not in the way,
    or when warps or CTA slots forbid one more CTA);
    ``loss``: the largest usage that keeps today's count (None when only the hardware's
    per-thread/per-CTA maximum stops it growing).
    """

    resource: str
    unit: str
    current: int
    gain: int | None
    loss: int | None
    also: tuple[str, ...] = ()

    def describe(self, ctas: int) -> str:
        parts = []
        if self.gain is not None:
            also = f" ({' and '.join(self.also)} must drop too)" if self.also else ""
            parts.append(f"<= {_amount(self.gain, self.unit)} ({self.gain - self.current:+d}) "
                         f"-> {ctas + 1} CTAs/SM{also}")
        if self.loss is not None:
            parts.append(f"> {_amount(self.loss, self.unit)} "
                         f"(+{self.loss - self.current + 1}) -> {ctas - 1} CTAs/SM")
        return f"{self.resource}: " + ("; ".join(parts) or "no cliff within the hardware limits")

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Occupancy:
    """CTAs (and warps) of one kernel resident per SM on one GPU."""

    gpu: str
    ctas_per_sm: int
    warps_per_sm: int
    max_warps_per_sm: int
    limited_by: tuple[str, ...]
    limits: dict[str, int]
    cliffs: tuple[Cliff, ...]

    @property
    def occupancy_pct(self) -> float:
        return 100.0 * self.warps_per_sm / self.max_warps_per_sm

    @property
    def next_cliff(self) -> str:
        """Where registers and shared memory would change the CTA count, in words."""
        return "; ".join(cliff.describe(self.ctas_per_sm) for cliff in self.cliffs)

    def to_dict(self) -> dict[str, object]:
        return {"gpu": self.gpu, "ctas_per_sm": self.ctas_per_sm,
                "warps_per_sm": self.warps_per_sm, "occupancy_pct": self.occupancy_pct,
                "limited_by": list(self.limited_by), "limits": self.limits,
                "cliffs": [c.to_dict() for c in self.cliffs], "next_cliff": self.next_cliff}


def _largest(fits: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The largest value in [lo, hi] for which ``fits`` holds (``fits`` holds on a prefix)."""
    if hi < lo or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


#: The resources a kernel author can trade: name in ``limits`` -> (cliff name, unit).
_ADJUSTABLE = {"registers": ("registers", "registers/thread"),
               "shared_memory": ("shared memory", "bytes/CTA")}


def occupancy(spec: GpuSpec, threads_per_cta: int, regs_per_thread: int,
              smem_per_cta: int) -> Occupancy:
    """Resident CTAs per SM for a kernel: the minimum over the four limits, and the cliffs."""
    usage = {"registers": regs_per_thread, "shared_memory": smem_per_cta}
    upper = {"registers": spec.max_regs_per_thread, "shared_memory": spec.smem_per_cta_optin}
    relaxed = {"registers": 1, "shared_memory": 0}

    def ctas_with(**changes: int) -> int:
        values = usage | changes
        return min(_limits(spec, threads_per_cta, values["registers"],
                           values["shared_memory"]).values())

    limits = _limits(spec, threads_per_cta, regs_per_thread, smem_per_cta)
    ctas = min(limits.values())
    limited_by = tuple(name for name, value in limits.items() if value == ctas)
    cliffs = []
    for name, (label, unit) in _ADJUSTABLE.items():
        others = {other: relaxed[other] for other in _ADJUSTABLE if other != name}
        gain = _largest(lambda u, name=name, others=others:
                        ctas_with(**others, **{name: u}) > ctas, 0, usage[name])
        loss = _largest(lambda u, name=name: ctas_with(**{name: u}) >= ctas,
                        usage[name], upper[name])
        cliffs.append(Cliff(
            label, unit, usage[name],
            gain=None if gain == usage[name] else gain,
            loss=None if loss == upper[name] or ctas == 0 else loss,
            also=tuple(_ADJUSTABLE[o][0] for o in others if o in limited_by),
        ))
    warps = -(-threads_per_cta // 32)
    return Occupancy(spec.name, ctas, ctas * warps, spec.max_warps_per_sm, limited_by, limits,
                     tuple(cliffs))
