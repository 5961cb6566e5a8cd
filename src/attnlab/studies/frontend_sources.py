"""The front-end study's kernels as CUDA C++ sources (built by nvcc) and Triton functions
(built by Triton, imported only where Triton is installed). They exist for the comparison
only (``attnlab.studies.frontends``): the product's kernels are the CuTe DSL ones.

Each kernel does what its CuTe DSL counterpart does, in the same shape:
``vector_add`` one element a thread; ``gather_sum`` the cymatic study's gather (each thread
sums ``data[index[i]]`` over a grid-stride walk); ``hgemm_tile`` a 128 x 128 x 32 bf16 tile
over 8 warps (4 x 2), both operands K-major, cp.async double buffering into padded shared
memory (+8 halves a row), fp32 C: the ``mma.sync`` ladder kernel's ``MmaGemmConfig`` at
those knobs (CUDA through the WMMA API, Triton through ``tl.dot``); ``attention_tile``
FlashAttention-2's forward at head dim 64 with 64 x 64 tiles over 4 warps (the attention
ladder's k02 shape; CUDA through WMMA with O in shared memory, Triton through ``tl.dot``).
"""

VECTOR_ADD_CU = r"""
extern "C" __global__ void vector_add(const float* __restrict__ a,
                                      const float* __restrict__ b,
                                      float* __restrict__ c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
"""

GATHER_SUM_CU = r"""
extern "C" __global__ void gather_sum(const float* __restrict__ data,
                                      const int* __restrict__ index,
                                      float* __restrict__ out, int count) {
  int threads = gridDim.x * blockDim.x;
  int first = blockIdx.x * blockDim.x + threadIdx.x;
  float acc = 0.f;
#pragma unroll 4
  for (int i = first; i < count; i += threads) acc += data[index[i]];
  out[first] = acc;
}
"""

#: The WMMA tile, for one operand type: ``{name}``, ``{element}`` (A and B), ``{acc}`` (C).
_WMMA_TILE_CU = r"""
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

constexpr int BM = 128, BN = 128, BK = 32, LD = BK + 16 / sizeof({element}), THREADS = 256;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {{
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}}

// C[M, N] = A[M, K] @ B[N, K]^T, whole tiles: M, N multiples of 128, K of 32.
extern "C" __global__ void __launch_bounds__(THREADS)
{name}(const {element}* __restrict__ A, const {element}* __restrict__ B,
       {acc}* __restrict__ C, int M, int N, int K) {{
  __shared__ __align__(128) {element} sA[2][BM][LD];
  __shared__ __align__(128) {element} sB[2][BN][LD];
  const int warp = threadIdx.x / 32, wm = warp % 4, wn = warp / 4;  // warp tile 32 x 64
  const {element}* gA = A + (size_t)blockIdx.x * BM * K;
  const {element}* gB = B + (size_t)blockIdx.y * BN * K;
  constexpr int CHUNK = 16 / sizeof({element});
  wmma::fragment<wmma::accumulator, 16, 16, 16, {acc}> acc[2][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[i][j], 0);

  auto load = [&](int stage, int k0) {{
#pragma unroll
    for (int c = threadIdx.x; c < BM * BK / CHUNK; c += THREADS) {{
      int row = c / (BK / CHUNK), col = c % (BK / CHUNK) * CHUNK;
      cp_async16(&sA[stage][row][col], gA + (size_t)row * K + k0 + col);
      cp_async16(&sB[stage][row][col], gB + (size_t)row * K + k0 + col);
    }}
    asm volatile("cp.async.commit_group;\n");
  }};

  const int tiles = K / BK;
  load(0, 0);
  for (int t = 0; t < tiles; ++t) {{
    if (t + 1 < tiles) {{
      load((t + 1) & 1, (t + 1) * BK);
      asm volatile("cp.async.wait_group 1;\n");
    }} else {{
      asm volatile("cp.async.wait_group 0;\n");
    }}
    __syncthreads();
    const int s = t & 1;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {{
      wmma::fragment<wmma::matrix_a, 16, 16, 16, {element}, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, {element}, wmma::col_major> fb[4];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &sA[s][wm * 32 + i * 16][kk], LD);
#pragma unroll
      for (int j = 0; j < 4; ++j) wmma::load_matrix_sync(fb[j], &sB[s][wn * 64 + j * 16][kk], LD);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }}
    __syncthreads();
  }}
  {acc}* gC = C + (size_t)(blockIdx.x * BM + wm * 32) * N + blockIdx.y * BN + wn * 64;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      wmma::store_matrix_sync(gC + (size_t)i * 16 * N + j * 16, acc[i][j], N,
                              wmma::mem_row_major);
}}
"""
HGEMM_TILE_CU = _WMMA_TILE_CU.format(name="hgemm_tile", element="__nv_bfloat16", acc="float")
#: The same tile on s8 operands with int32 sums: IMMA instructions, the subject of the lab's
#: IMMA control-code edit (attnlab's INT8 GEMM issues IGMMA on Hopper, no IMMA).
IGEMM_TILE_CU = _WMMA_TILE_CU.format(name="igemm_tile", element="signed char", acc="int")

ATTENTION_TILE_CU = r"""
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

// FlashAttention-2's forward for head dim 64: a CTA of 4 warps takes 64 query rows (16 a
// warp), walks the keys 64 at a time, S = Q K^T and O += P V by WMMA, the online softmax per
// row in fp32 (two lanes a row), O kept in shared memory (WMMA hides the accumulator's
// layout, so its rows are rescaled there). q, k, v, o: [B, S, H, 64] bf16, S a multiple of 64.
constexpr int D = 64, BR = 64, BC = 64, LDH = D + 8, LDF = BC + 4, THREADS = 128;

extern "C" __global__ void __launch_bounds__(THREADS)
attention_tile(const __nv_bfloat16* __restrict__ Q, const __nv_bfloat16* __restrict__ K,
               const __nv_bfloat16* __restrict__ V, __nv_bfloat16* __restrict__ O,
               int S, int H, float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  auto sQ = reinterpret_cast<__nv_bfloat16 (*)[LDH]>(smem);  // Q, then each warp's P rows
  auto sK = reinterpret_cast<__nv_bfloat16 (*)[LDH]>(smem + BR * LDH * 2);
  auto sV = reinterpret_cast<__nv_bfloat16 (*)[LDH]>(smem + (BR + BC) * LDH * 2);
  auto sS = reinterpret_cast<float (*)[LDF]>(smem + (BR + 2 * BC) * LDH * 2);
  auto sO = reinterpret_cast<float (*)[LDF]>(smem + (BR + 2 * BC) * LDH * 2 + BR * LDF * 4);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * 16 + lane / 2, half = lane % 2;  // this lane's half of a row
  const int b = blockIdx.y / H, h = blockIdx.y % H, q0 = blockIdx.x * BR;
  const size_t stride = (size_t)H * D, base = (size_t)b * S * stride + h * D;

  for (int c = threadIdx.x; c < BR * D / 8; c += THREADS) {
    int r = c / (D / 8), col = c % (D / 8) * 8;
    *reinterpret_cast<int4*>(&sQ[r][col]) =
        *reinterpret_cast<const int4*>(Q + base + (q0 + r) * stride + col);
  }
  for (int i = threadIdx.x; i < BR * LDF; i += THREADS) (&sO[0][0])[i] = 0.f;
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fq[D / 16];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) wmma::load_matrix_sync(fq[kk], &sQ[warp * 16][kk * 16], LDH);
  float m = -INFINITY, l = 0.f;

  for (int k0 = 0; k0 < S; k0 += BC) {
    __syncthreads();  // every warp is done with the previous K and V
    for (int c = threadIdx.x; c < BC * D / 8; c += THREADS) {
      int r = c / (D / 8), col = c % (D / 8) * 8;
      *reinterpret_cast<int4*>(&sK[r][col]) =
          *reinterpret_cast<const int4*>(K + base + (k0 + r) * stride + col);
      *reinterpret_cast<int4*>(&sV[r][col]) =
          *reinterpret_cast<const int4*>(V + base + (k0 + r) * stride + col);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < BC / 16; ++j) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> fs;
      wmma::fill_fragment(fs, 0.f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fk;
        wmma::load_matrix_sync(fk, &sK[j * 16][kk * 16], LDH);
        wmma::mma_sync(fs, fq[kk], fk, fs);
      }
      wmma::store_matrix_sync(&sS[warp * 16][j * 16], fs, LDF, wmma::mem_row_major);
    }
    __syncwarp();
    const float* s_row = &sS[row][half * 32];
    float top = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) top = fmaxf(top, s_row[c]);
    top = fmaxf(top, __shfl_xor_sync(0xffffffff, top, 1));
    const float m_new = fmaxf(m, top * scale_log2), alpha = exp2f(m - m_new);
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      float p = exp2f(s_row[c] * scale_log2 - m_new);
      sQ[row][half * 32 + c] = __float2bfloat16(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    l = l * alpha + sum;
    m = m_new;
#pragma unroll
    for (int c = 0; c < 32; ++c) sO[row][half * 32 + c] *= alpha;
    __syncwarp();
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> fo;
      wmma::load_matrix_sync(fo, &sO[warp * 16][j * 16], LDF, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fp;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fv;
        wmma::load_matrix_sync(fp, &sQ[warp * 16][kk * 16], LDH);
        wmma::load_matrix_sync(fv, &sV[kk * 16][j * 16], LDH);
        wmma::mma_sync(fo, fp, fv, fo);
      }
      wmma::store_matrix_sync(&sO[warp * 16][j * 16], fo, LDF, wmma::mem_row_major);
    }
    __syncwarp();
  }
  const float inv = 1.f / l;
  __nv_bfloat16* o_row = O + base + (q0 + row) * stride + half * 32;
#pragma unroll
  for (int c = 0; c < 32; ++c) o_row[c] = __float2bfloat16(sO[row][half * 32 + c] * inv);
}
"""
#: Dynamic shared memory of ``attention_tile`` (above the 48 KiB a launch gets by default).
ATTENTION_TILE_SMEM = (64 + 2 * 64) * 72 * 2 + 2 * 64 * 68 * 4

#: name -> (CUDA source, kernel symbol).
CUDA_SOURCES = {"vector_add": (VECTOR_ADD_CU, "vector_add"),
                "gather_sum": (GATHER_SUM_CU, "gather_sum"),
                "hgemm_tile": (HGEMM_TILE_CU, "hgemm_tile"),
                "igemm_tile": (IGEMM_TILE_CU, "igemm_tile"),
                "attention_tile": (ATTENTION_TILE_CU, "attention_tile")}


def triton_kernels() -> dict:
    """name -> Triton function (imports Triton: call only where it is installed)."""
    import triton
    import triton.language as tl

    @triton.jit
    def vector_add(a, b, c, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = i < n
        tl.store(c + i, tl.load(a + i, mask=inside) + tl.load(b + i, mask=inside), mask=inside)

    @triton.jit
    def gather_sum(data, index, out, count, threads, BLOCK: tl.constexpr):
        first = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for step in range(0, tl.cdiv(count, threads)):
            i = first + step * threads
            inside = i < count
            where = tl.load(index + i, mask=inside, other=0)
            acc += tl.load(data + where, mask=inside, other=0.0)
        tl.store(out + first, acc)

    @triton.jit
    def hgemm_tile(A, B, C, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        ks = tl.arange(0, BK)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, K, BK):
            a = tl.load(A + rows[:, None] * K + (k0 + ks)[None, :])
            b = tl.load(B + cols[:, None] * K + (k0 + ks)[None, :])
            acc += tl.dot(a, tl.trans(b))
        tl.store(C + rows[:, None] * N + cols[None, :], acc)

    @triton.jit
    def attention_tile(Q, K, V, O, S, H, scale_log2, D: tl.constexpr, BR: tl.constexpr,
                       BC: tl.constexpr):
        rows = tl.program_id(0) * BR + tl.arange(0, BR)
        batch, head = tl.program_id(1) // H, tl.program_id(1) % H
        stride = H * D
        base = batch * S * stride + head * D
        cols = tl.arange(0, D)
        q = tl.load(Q + base + rows[:, None] * stride + cols[None, :])
        m = tl.full([BR], float("-inf"), dtype=tl.float32)
        total = tl.zeros([BR], dtype=tl.float32)
        acc = tl.zeros([BR, D], dtype=tl.float32)
        for k0 in range(0, S, BC):
            keys = k0 + tl.arange(0, BC)
            k = tl.load(K + base + keys[:, None] * stride + cols[None, :])
            v = tl.load(V + base + keys[:, None] * stride + cols[None, :])
            s = tl.dot(q, tl.trans(k)) * scale_log2
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m - m_new)
            total = total * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
            m = m_new
        tl.store(O + base + rows[:, None] * stride + cols[None, :],
                 (acc / total[:, None]).to(tl.bfloat16))

    return {"vector_add": vector_add, "gather_sum": gather_sum, "hgemm_tile": hgemm_tile,
            "attention_tile": attention_tile}
