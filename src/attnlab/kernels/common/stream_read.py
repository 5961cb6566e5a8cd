"""The read-ceiling study's reader (``scripts/read_ceiling.py``): one kernel that only reads a
buffer from DRAM. A CTA reads chunks in rounds of coalesced 16-byte ``cp.async`` copies,
``STAGES`` rounds (128 KiB, the decoding's K/V ring) in flight. **static**: CTA ``i`` reads the
``i``-th equal range, as a split decoding does; **dynamic**: CTA ``i`` starts at chunk ``i``
and takes each next one from a counter (asked a chunk ahead); the counter is never reset, a
call passing its value before it (``base``). Thread 0 stamps ``%globaltimer`` at its CTA's
start and end."""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

THREADS = 256
#: 16-byte copies a thread issues a round (32 KiB a CTA) ...
UNROLL = 8
#: ... and rounds in flight.
STAGES = 4
#: 32-bit words a 16-byte copy moves, and a round.
VEC = 4
ROUND_WORDS = THREADS * UNROLL * VEC
ROUND_BYTES = ROUND_WORDS * 4


def _vector(tensor: cute.Tensor, offset) -> cute.Tensor:
    """``VEC`` words of ``tensor`` from word ``offset`` (a multiple of ``VEC``): 16 bytes on
    a 16-byte boundary, which the copy atom needs to see."""
    address = (tensor.iterator + offset).toint()
    return cute.make_tensor(cute.make_ptr(cutlass.Int32, address, tensor.memspace,
                                          assumed_align=16), cute.make_layout(VEC))


class StreamRead:
    """``(buf i32 [N], counter i32 [1], stamps i64 [2 grid], sink i32 [grid THREADS], base)``."""

    def __init__(self, chunk_bytes: int, dynamic: bool):
        assert chunk_bytes % ROUND_BYTES == 0
        self.chunk_bytes, self.dynamic = chunk_bytes, dynamic

    @cute.jit
    def __call__(self, buf: cute.Tensor, counter: cute.Tensor, stamps: cute.Tensor,
                 sink: cute.Tensor, base: cutlass.Int32, stream: cuda.CUstream):
        self.kernel(buf, counter, stamps, sink, base).launch(
            grid=[sink.shape[0] // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, buf: cute.Tensor, counter: cute.Tensor, stamps: cute.Tensor,
               sink: cute.Tensor, base: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        if tidx == 0:
            stamps[2 * bidx] = cute.arch.globaltimer()
        words, rounds = self.chunk_bytes // 4, self.chunk_bytes // ROUND_BYTES
        chunks = buf.shape[0] // words

        @cute.struct
        class Shared:
            next: cute.struct.MemRange[cutlass.Int32, 1]
            rounds: cute.struct.Align[cute.struct.MemRange[cutlass.Int32,
                                                           STAGES * ROUND_WORDS], 128]

        shared = cutlass.memory.SmemAllocator().allocate(Shared)
        landing = shared.rounds.get_tensor(cute.make_layout(STAGES * ROUND_WORDS))
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
                                   cutlass.Int32, num_bits_per_copy=VEC * 32)
        if cutlass.const_expr(self.dynamic):
            slot = shared.next.get_tensor(cute.make_layout(1))
            chunk, done = cutlass.Int32(bidx), cutlass.Int32(0)
            while chunk < chunks:
                ticket = cutlass.Int32(0)
                if tidx == 0:
                    ticket = cute.arch.atomic_add(counter.iterator, cutlass.Int32(1),
                                                  sem="relaxed", scope="gpu")
                self._read(atom, buf, cutlass.Int64(chunk) * words, rounds, landing, tidx,
                           done)
                done += rounds
                if tidx == 0:
                    slot[0] = ticket - base + grid
                cute.arch.sync_threads()
                chunk = slot[0]
                cute.arch.sync_threads()
        else:
            per_cta = chunks // grid
            self._read(atom, buf, cutlass.Int64(bidx * per_cta) * words, rounds * per_cta,
                       landing, tidx, 0)
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        if tidx == 0:
            stamps[2 * bidx + 1] = cute.arch.globaltimer()
        sink[bidx * THREADS + tidx] = landing[tidx]

    @cute.jit
    def _read(self, atom: cute.CopyAtom, buf: cute.Tensor, first: cutlass.Int64, rounds,
              landing: cute.Tensor, tidx, done) -> None:
        # A round lands in the slot of the round STAGES before it, which the wait saw land
        # (two copies in flight to one slot read a third less from L2 on an H200).
        for r in cutlass.range(rounds, unroll=1):
            for j in cutlass.range_constexpr(UNROLL):
                offset = (j * THREADS + tidx) * VEC
                cute.copy(atom, _vector(buf, first + r * ROUND_WORDS + offset),
                          _vector(landing, (done + r) % STAGES * ROUND_WORDS + offset))
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(STAGES - 1)


def compile_stream_read(arch: str, chunk_bytes: int, dynamic: bool, dump_dir=None):
    """The reader compiled for ``arch`` (TVM-FFI; called with torch tensors and ``base``);
    with ``dump_dir`` its cubin is written there too."""
    from cutlass.cute.runtime import make_fake_tensor

    from attnlab.jit import compile_kernel

    vectors = tuple(make_fake_tensor(t, (cute.sym_int(),), stride=(1,), assumed_align=16)
                    for t in (cutlass.Int32, cutlass.Int32, cutlass.Int64, cutlass.Int32))
    return compile_kernel(StreamRead(chunk_bytes, dynamic), (*vectors, cutlass.Int32(0)),
                          arch=arch, dump_dir=dump_dir)
