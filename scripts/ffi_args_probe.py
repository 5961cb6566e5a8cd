"""What a TVM-FFI launch's arguments cost on the host: one tiny kernel (``c = a + b`` over 256
floats) compiled to take its vectors as torch tensors, or two of them as 64-bit addresses
(tensors built inside the jit function), and an empty kernel of one tensor; each called 20,000
times back to back (the host is the bound), the wall time per call reported
(``python3 scripts/ffi_args_probe.py --out DIR``)."""

import argparse
import json
import time
from pathlib import Path

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from attnlab.jit import compile_kernel
from attnlab.kernels.common.vector_add import THREADS, VectorAdd, compile_vector_add

CALLS = 20000


class AddressAdd:
    """``__call__(a, b, c)``: the same sum with ``a`` and ``b`` as addresses of fp32 vectors
    of ``c``'s length (TVM-FFI finds the stream from a tensor argument, so ``c`` stays one)."""

    @cute.jit
    def __call__(self, a: cutlass.Int64, b: cutlass.Int64, c: cute.Tensor,
                 stream: cuda.CUstream):
        a_t, b_t = (cute.make_tensor(cute.make_ptr(cutlass.Float32, x, cute.AddressSpace.gmem,
                                                   assumed_align=16), c.layout)
                    for x in (a, b))
        VectorAdd().kernel(a_t, b_t, c).launch(grid=[cute.ceil_div(c.shape[0], THREADS), 1, 1],
                                               block=[THREADS, 1, 1], stream=stream)


class Empty:
    """A launch whose one argument (a tensor, for the stream) the kernel ignores."""

    @cute.jit
    def __call__(self, c: cute.Tensor, stream: cuda.CUstream):
        self.kernel().launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self):
        pass


def per_call_us(fn) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    arch = "sm_90a"
    a, b, c = (torch.randn(256, device="cuda") for _ in range(3))
    by_tensor = compile_vector_add(arch)
    vector = make_fake_tensor(cutlass.Float32, (cute.sym_int(),), stride=(1,), assumed_align=16)
    by_address = compile_kernel(AddressAdd(), (cutlass.Int64(0),) * 2 + (vector,), arch=arch)
    empty = compile_kernel(Empty(), (vector,), arch=arch)
    addresses = (a.data_ptr(), b.data_ptr())
    rows = {}
    for round_ in range(2):
        rows[f"one tensor, empty kernel {round_}"] = per_call_us(lambda: empty(c))
        rows[f"three tensors {round_}"] = per_call_us(lambda: by_tensor(a, b, c))
        rows[f"one tensor, two addresses {round_}"] = per_call_us(
            lambda: by_address(*addresses, c))
        rows[f"... with data_ptr() {round_}"] = per_call_us(
            lambda: by_address(a.data_ptr(), b.data_ptr(), c))
        rows[f"torch.add {round_}"] = per_call_us(lambda: torch.add(a, b, out=c))
    c.zero_()
    by_address(*addresses, c)
    torch.cuda.synchronize()
    assert torch.equal(c, a + b), "the address kernel's sum is wrong"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ffi_args.json").write_text(json.dumps(rows, indent=1))
    for name, us in rows.items():
        print(f"{name:32s} {us:6.2f} us a call")


if __name__ == "__main__":
    main()
