"""FlashAttention-2 backward for sm80+ (``mma.sync``), configured by ``BackwardConfig``.

The walk and the math between the GEMMs are ``kernels/common/backward_walk.py``'s; this class
supplies the ``mma.sync`` GEMMs. Four of the five are the forward's two shapes
(``docs/backward.md``): S^T = K_j Q_i^T and dP^T = V_j dO_i^T are S = Q K^T with both
operands K-major (``ldmatrix``); dV += P^T dO and dK += dS^T Q are O += P V with A from the
accumulator registers and B read by ``ldmatrix.trans``; dQ += dS K reads dS^T by
``ldmatrix.trans`` as its A operand. The warps split B_c for the first four (16 key rows
each) and (B_r, D) for dQ (``BackwardConfig.dq_warps``). With ``kv_warps_n = 2``
(``split_head_dim``: FA2's two-dimensional layout, and above hd128 the only one whose dK and
dV fit) two warps share their key rows and split B_r (S^T, dP^T) and D (dV, dK) between
them: each reads half of Q_i and dO_i instead of the whole tiles, dK and dV take half the
registers, and P^T and dS^T, partly another warp's registers now, reach dV and dK through
shared memory by ``ldmatrix``. Every GEMM loads its shared
operands one MMA_K step at a time, the next step's ``ldmatrix`` before this step's MMAs (the
forward's measured schedule, kernels 4-5).
"""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warp

from attnlab.kernels.common.backward_walk import BackwardKernel
from attnlab.kernels.common.base import shared_tile
from attnlab.kernels.common.epilogue import store_fragment
from attnlab.kernels.common.layouts import acc_as_operand_a, smem_tile_layout
from attnlab.kernels.sm80.ldmatrix_gemm import gemm

#: ldmatrix fragments per shared->register load (one MMA_K step), double buffered.
FRAGS = 2


class FlashBackwardSm80(BackwardKernel):
    """The ``mma.sync`` backward kernel of a ``BackwardSpec``."""

    def smem_layouts(self) -> tuple:
        cfg, D = self.cfg, self.head_dim
        return (smem_tile_layout("xor", cfg.block_m, D, cfg.q_stages),
                smem_tile_layout("xor", cfg.block_n, D),
                smem_tile_layout("xor", cfg.block_n, cfg.block_m))

    def smem_tensor(self, buffer, layout) -> cute.Tensor:
        return buffer.get_tensor(layout)

    def tiled_mmas(self) -> tuple:
        """S^T, dP^T, dV and dK (warps along B_c; with ``split_head_dim`` pairs of warps
        along N), and dQ (``dq_warps``)."""
        cfg = self.cfg
        op = warp.MmaF16BF16Op(self.dtype, cutlass.Float32, (16, 8, 16))
        wm, wn = cfg.dq_warps
        along_c, along_n = cfg.kv_warps
        # N = 16 per warp lets one ldmatrix.x4 feed two n8 MMAs of the B operand.
        return (cute.make_tiled_mma(op, (along_c, along_n, 1),
                                    permutation_mnk=(cfg.block_n, along_n * 16, 16)),
                cute.make_tiled_mma(op, (wm, wn, 1), permutation_mnk=(wm * 16, wn * 16, 16)))

    def operands(self, tidx, mmas: tuple, tiles: tuple, storage) -> tuple:
        """Per operand (fragment, (tiled ldmatrix copy, shared source, register view)), the
        Q and dO sources keeping their stage mode."""
        mma_kv, mma_dq = mmas
        sQ, sdO, sK, sV, sdS, sQt, sdOt, sKt, sdSt = tiles
        thr_kv, thr_dq = mma_kv.get_slice(tidx), mma_dq.get_slice(tidx)
        ldsm, ldsm_t = (cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=t,
                                                                   num_matrices=4), self.dtype)
                        for t in (False, True))
        # (fragment, tiled copy, source) of K, Q, V, dO (S^T and dP^T), dO^T, Q^T (dV, dK),
        # dS, K^T (dQ).
        plan = ((thr_kv.make_fragment_A(thr_kv.partition_A(sK)),
                 cute.make_tiled_copy_A(ldsm, mma_kv), sK),
                (thr_kv.make_fragment_B(thr_kv.partition_B(sQ[None, None, 0])),
                 cute.make_tiled_copy_B(ldsm, mma_kv), sQ),
                (thr_kv.make_fragment_A(thr_kv.partition_A(sV)),
                 cute.make_tiled_copy_A(ldsm, mma_kv), sV),
                (thr_kv.make_fragment_B(thr_kv.partition_B(sdO[None, None, 0])),
                 cute.make_tiled_copy_B(ldsm, mma_kv), sdO),
                (thr_kv.make_fragment_B(thr_kv.partition_B(sdOt[None, None, 0])),
                 cute.make_tiled_copy_B(ldsm_t, mma_kv), sdOt),
                (thr_kv.make_fragment_B(thr_kv.partition_B(sQt[None, None, 0])),
                 cute.make_tiled_copy_B(ldsm_t, mma_kv), sQt),
                (thr_dq.make_fragment_A(thr_dq.partition_A(sdSt[None, None, 0])),
                 cute.make_tiled_copy_A(ldsm_t, mma_dq), sdSt[None, None, 0]),
                (thr_dq.make_fragment_B(thr_dq.partition_B(sKt)),
                 cute.make_tiled_copy_B(ldsm_t, mma_dq), sKt))
        if cutlass.const_expr(self.cfg.split_head_dim):
            # P^T and dS^T (dV's and dK's A) from shared memory.
            sP = storage.sP.get_tensor(self.smem_layouts()[2])
            plan += tuple((thr_kv.make_fragment_A(thr_kv.partition_A(s[None, None, 0])),
                           cute.make_tiled_copy_A(ldsm, mma_kv), s[None, None, 0])
                          for s in (sP, sdS))
        result = []
        for frag, copy, src in plan:
            thr = copy.get_slice(tidx)
            result.append((frag, (copy, thr.partition_S(src), thr.retile(frag))))
        return (mmas, thr_kv, thr_dq, tuple(result), (storage, tidx))

    def extra_smem(self) -> dict:
        if self.cfg.split_head_dim:
            return {"sP": shared_tile(self.dtype, self.smem_layouts()[2])}
        return {}

    @staticmethod
    def _staged(load, stage):
        return (load[0], load[1][None, None, None, stage], load[2])

    def _new_acc(self, thr, shape) -> cute.Tensor:
        acc = cute.make_rmem_tensor(thr.partition_shape_C(shape), cutlass.Float32)
        acc.fill(0.0)
        return acc

    def gemm_s_dp(self, ops: tuple, stage, probabilities) -> tuple:
        """S^T = K Q^T, ``probabilities(S^T)``, then dP^T = V dO^T."""
        (mma_kv, _), thr_kv, _, parts, _ = ops
        (tK, lK), (tQ, lQ), (tV, lV), (tdO, ldO) = parts[:4]
        shape = (self.cfg.block_n, self.cfg.block_m)
        acc_S, acc_dP = self._new_acc(thr_kv, shape), self._new_acc(thr_kv, shape)
        gemm(mma_kv, acc_S, tK, tQ, lK, self._staged(lQ, stage), FRAGS, FRAGS, True)
        probabilities(acc_S)
        gemm(mma_kv, acc_dP, tV, tdO, lV, self._staged(ldO, stage), FRAGS, FRAGS, True)
        return acc_S, acc_dP

    def gemm_dkv_dq(self, ops: tuple, stage, ds_stage, rP: cute.Tensor, rdS: cute.Tensor,
                    acc_dK: cute.Tensor, acc_dV: cute.Tensor, store_ds, finish_dq) -> None:
        """dV += P^T dO, dS^T to shared memory (``store_ds``; one tile, ``ds_stage`` 0),
        dK += dS^T Q, then dQ = dS K once every warp's dS^T has landed, handed to
        ``finish_dq``; with ``dq_first`` dK comes last, so that dQ's adds go out between
        its MMAs. With ``split_head_dim`` P^T and dS^T are stored before the barrier and
        dV's and dK's A read back by ``ldmatrix``."""
        (mma_kv, mma_dq), _, thr_dq, parts, (storage, tidx) = ops
        (tdOt, ldOt), (tQt, lQt) = parts[4], parts[5]
        (tdS, ldS), (tKt, lKt) = parts[6], parts[7]
        split = self.cfg.split_head_dim

        def dk():
            if cutlass.const_expr(split):
                tdS_a, ldS_a = parts[9]
                gemm(mma_kv, acc_dK, tdS_a, tQt, ldS_a, self._staged(lQt, stage), FRAGS,
                     FRAGS, True)
            else:
                gemm(mma_kv, acc_dK, acc_as_operand_a(rdS), tQt, None,
                     self._staged(lQt, stage), 0, FRAGS, True)

        if cutlass.const_expr(split):
            store_ds()
            store_fragment(rP, storage.sP.get_tensor(self.smem_layouts()[2])[None, None, 0],
                           mma_kv, tidx)
            self.smem_to_mma()
            tP, lP = parts[8]
            gemm(mma_kv, acc_dV, tP, tdOt, lP, self._staged(ldOt, stage), FRAGS, FRAGS, True)
        else:
            gemm(mma_kv, acc_dV, acc_as_operand_a(rP), tdOt, None, self._staged(ldOt, stage),
                 0, FRAGS, True)
            store_ds()
        if cutlass.const_expr(not self.cfg.dq_first):
            dk()
        if cutlass.const_expr(not split):
            self.smem_to_mma()
        acc = self._new_acc(thr_dq, (self.cfg.block_m, self.head_dim))
        gemm(mma_dq, acc, tdS, tKt, ldS, lKt, FRAGS, FRAGS, True)
        finish_dq(acc)
        if cutlass.const_expr(self.cfg.dq_first):
            dk()
