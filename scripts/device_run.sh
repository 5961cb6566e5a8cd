#!/usr/bin/env bash
# One call on a GPU machine; the CuTe DSL release and the peers' wheels come with
# ../shared/scripts/dsl-wheels (run 1 carries .dsl-a: `bash .dsl-a/env.sh`; run 2 carries .dsl-b
# and starts with `. .dsl-b/env.sh && bash scripts/device_run.sh MODE`; while the machine stays
# warm, later runs start with `. .dsl-b/env.sh &&` and carry nothing).
#   test     compile this GPU's defaults into the kernel cache, then the GPU tests
#   bench    the host section (us per call, first calls) and the end-to-end bench grid
#   sm90     wgmma tile candidates per head dim against the peers (scripts/sm90_candidates.py;
#            later arguments go to it, e.g. --head-dims 96,192)
#   table    the Hopper table: the default against FA4, cuDNN and FA2 (scripts/hopper_table.py)
#   dynamic [SEQLEN...]  the persistent forward's GPU tests (static and dynamic walks; a hung
#            kernel is cut at 300 s), then the hd128 and hd256 candidates at the masked points the
#            static walk leaves unbalanced (causal, each SEQLEN given, e.g. 16384 8192)
#   masked   hd64 causal, the static walk against the counter by length (1280-4096 at 12k
#            tokens, bf16 and fp16): the static walk won at 2048 and 4096, lost at 1536 and
#            3072 (thirty-sixth session); which lengths take which (scripts/sm90_candidates.py)
#   lateo    the epilogue's addresses built after the K/V loop (late_o_addresses) against
#            the default: hd64 plain and causal 8k/16k, hd128 causal 8k/16k, hd32 4k, bf16
#            and fp16 (scripts/sm90_candidates.py)
#   lateprof hd64 causal 16k: ncu (with stall samples) of the default and of the same with
#            late_o_addresses, FA4 beside (the late build drops the default's spills and waits
#            later for P V, yet measured 3 % slower: thirty-seventh session)
#   dtypeprof  ncu (with stall samples and the SM clock) of the default and FA4 in bf16 and
#            fp16 at hd64 plain 4k and hd128 causal 4k: where fp16's extra 1.4-4.2 % goes
#   power    clocks, power and energy per call while attnlab, FA4 and cuDNN (and the 8192^3
#            matrix product, cuBLAS and ours) run back to back alone (scripts/power_probe.py:
#            why end to end sits under device only; later arguments go to it)
#   lazy     lazy rescaling (lazy_rescale): its GPU tests, then against the default at hd64
#            and hd128, plain and causal, 4k and 16k, bf16 and fp16, device only and end
#            to end (scripts/sm90_candidates.py), then under the power cap at hd64 and hd128
#            plain 16k (scripts/power_probe.py --candidates)
#   cluster [ARGS]  K and V multicast to clusters of two CTAs (cluster_m): its GPU tests (a
#            hung kernel is cut at 300 s; nothing more runs unless they pass), then against the
#            default (the default's walk with and without them, whichever is not the
#            default) at hd64/128/256 plain 4k-16k, bf16 and fp16 (scripts/sm90_candidates.py;
#            ARGS go to it, e.g. --seqlen 2048,16384 --runs 20), then under the power cap at
#            plain 16k (scripts/power_probe.py --candidates), hd128 and hd64 or the head dims
#            of CLUSTER_POWER (e.g. "128 256")
#   splittail [ARGS]  the last waves dealt out as runs of K/V blocks (split_tail): its GPU tests
#            and the clusters' (nothing more runs unless they pass), then against the default
#            at hd128/256 plain 2k-16k, bf16 and fp16 (scripts/sm90_candidates.py; ARGS go to it)
#   clusterprof  ncu of one launch each at plain 16k (hd128, then hd64): the default's walk
#            with one CTA a row block and in clusters of two (cluster_m), FA4 beside: kernel
#            time, L2 sectors the SMs asked for, what the L2 request coalescer looked up and
#            delivered, bytes into the SMs
#   narrow   the three-warpgroup masked tiles at narrower K/V blocks (hd32/64/96, causal 4k)
#   ladder   attnlab ladder, bf16 and fp16 (k01..k16, lab variants, Hopper steps)
#   ab REV [ARGS]  the forward's default against cuDNN at the one-CTA-per-tile masked points
#            (or ARGS' --points, e.g. 64:4096:plain:float16), with the source tree in .ab/REV
#            (git archive REV src | tar -x -C .ab/REV, carried) and with this one, each in its
#            own process and kernel cache, twice (scripts/ab_forward.py)
#   hopper   attnlab ladder --family sm90 at hd64 and hd128 (the wgmma kernel's steps, FA4, cuDNN)
#   gemmcand the GEMM and conv GPU tests, then scripts/gemm_candidates.py with ARGS
#            (e.g. --shapes 512x512x4096 --tiles 64x64x128 --splits 1,2)
#   gemmpeer what cuBLAS runs beside ours at one shape (kernel names, torch profiler), then ncu
#            of one launch of each: L2 sectors asked by the SMs, bytes delivered, cluster size
#   ffiargs  what a TVM-FFI launch's tensor arguments cost on the host against 64-bit
#            addresses (scripts/ffi_args_probe.py), then gemmhost
#   gemmhost where a GEMM call's host time goes (scripts/gemm_host.py: matmul per split mode,
#            int8_matmul, their peers and the calls' parts)
#   sm80path the sm80 path of this GPU (mma.sync forward + backward, mma_sync_backward_for)
#            against FA2, cuDNN and FA4, bf16 and fp16, beside the backward in the other GEMM order
#   window ARGS  the masked GPU tests (sliding windows and causal, the long bands among them),
#            then scripts/window_candidates.py ARGS: sliding windows at 8k/16k queries, the
#            default each query-length bucket gives against FA4 (e.g. --head-dims 128,256
#            --dtypes bfloat16,float16)
#   deccand ARGS  the decoding GPU tests, then scripts/decode_candidates.py ARGS (e.g. --tma:
#            K/V by TMA boxes against the row gathers; --paged, --combine, --merge)
#   dechost  where a decoding call's host time goes (scripts/decode_host.py: the call, SDPA
#            flash, and the call's parts at B = 1 and 8 x 4k keys, GQA and MQA, contiguous
#            and paged)
#   decmerge the decoding GPU tests, then the combine kernel against the serial merge
#            (scripts/decode_candidates.py --merge: device only and end to end)
#   readprobe [ARGS]  the streaming reader's GPU tests, then how fast one kernel reads N bytes:
#            torch.sum and the reader, static ranges against chunks taken from a counter,
#            with the CTAs' start and end spreads (scripts/read_ceiling.py --probe ARGS, e.g.
#            --mib 64 128 --grid 64 128 132)
#   decspans [--points B:KEYS:HQ:HKV,...] the same points' (or these) back-to-back spans on
#            the device's clock, contiguous and paged
#            (scripts/decode_spans.py: end to end per call, then a torch.profiler kernel
#            timeline: each call's period, busy and idle time)
#   hostab REV  decode_host.py and gemm_host.py with the source tree in .ab/REV (carried, as
#            for ab) and with this one, alternating, twice (host-side changes)
#   regimes [--points B:KEYS:HQ:HKV,...] a decoding call's host time with the device drained
#            against queued behind work, beside SDPA flash and a 1-element add_
#            (scripts/launch_regimes.py)
#   decab REV [ARGS]  the decoding GPU tests, then the split sweep (scripts/decode_candidates.py
#            ARGS: the chosen split count, twice, a half, a quarter, an eighth) with the source
#            tree in .ab/REV (carried, as for ab) and with this one, each in its own process
#            and kernel cache, twice
#   backward the backward's GPU tests (tests/test_backward_gpu.py and the training bench's), then
#            attnlab bench --backward: training (forward + backward, backward alone) against the
#            peers at issue 20's anchor shapes
#   bwdsweep backward-kernel candidates against the peers' backward (scripts/bwd_candidates.py;
#            later arguments go to it)
#   bwdab REV [ARGS]  backward candidates (scripts/bwd_candidates.py ARGS, e.g. --work
#            forward+backward --variants default,sm80 --masks causal) with the source tree in
#            .ab/REV (carried, as for ab) and with this one, each in its own process and kernel
#            cache, twice
#   bwdprof [--points HD,SEQ,CAUSAL ...]  where the backward's time goes, attnlab against FA4
#            (scripts/bwd_profile.py: the kernels of one autograd backward, ncu of each)
#   decode   the decoding GPU tests, then attnlab bench --decode over issue 21's grid in three
#            invocations (B 1 and 8 x 4k and 32k, 1 x 128k, 64 x 4k: each fits the GPU)
#   gemm     the GEMM family's GPU tests, then attnlab bench --family gemm (bf16 and fp16; later
#            arguments go to the bench, e.g. --shapes 4096x4096x4096), INT8, the HGEMM ladder
#   sparse   the 2:4 sparse and online INT8 GEMMs' GPU tests, then attnlab bench --family
#            sparse (against the dense kernels and torch's semi-structured sparse, one pruned A)
#   gemmtune attnlab tune --family gemm at the skinny shapes, then the bench there again (the
#            tuned configs in use)
#   conv     the convolution family's GPU tests, then attnlab bench --family conv (SD-UNet shapes)
#            and attnlab ladder --family conv
#   study    the lab's studies: the cymatic memory layout at 2048^2 and 8192^2, modes (6, 4) and
#            (5, 4), with its GPU test
#   sweep [GRID] the cymatic study's (n, m) sweep (Observation II's 54 modes) at GRID^2 (default
#            6144: 151 MB of fp32, 3x an H100's L2), saving after every mode
#   fastudy  Observation JJ: the FlashAttention block traces with the seed's 15 traces at 6144^2,
#            over the seed's coarse sweep (n in 3,5,6,7,9 x m in 2,4,6), with the GPU test
#   frontends  the front-end comparison (CuTe DSL, nvcc, Triton): its GPU tests, the timed
#            study, and the lab's IMMA and HMMA stall edits on nvcc's WMMA tiles (A/B, 60 runs)
#   explain  attnlab profile (ncu) and roofline
#   profile  ncu of the default against cuDNN and FA4 where the Hopper table misses (causal hd64,
#            hd256)
#   repeat N EXPR [WORKERS]  the GPU tests selected by -k EXPR, N times over (12 workers by
#            default), each run's failures kept in full (repeat-K.log): for a failure that
#            does not come back when its test runs alone
# Results (JSON, PNG, one log) go to $OUT (default ./results); tables print as they come.
set -uo pipefail
mode=${1:-test}
OUT=${OUT:-$PWD/results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=160
export ATTNLAB_TUNE_CACHE=$OUT/tune_cache.json
# One kernel cache for the whole machine: pytest workers and benches share what one compiled.
export ATTNLAB_CACHE_DIR=${ATTNLAB_CACHE_DIR:-/tmp/attnlab-kernels}
log=$OUT/run.log
attnlab() { python3 -m attnlab "$@" 2>&1 | tee -a "$log"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee -a "$log"
case $mode in
  test)
    attnlab cache --warm --jobs 16
    # The 2**31-element tests alone: beside 11 other workers they ran out of an H100's 80 GB.
    ATTNLAB_TEST_MEMORY_LOG=$OUT/memory.txt python3 -m pytest -m "gpu and not large_memory" -q \
      -p no:cacheprovider -n 12 -rfE 2>&1 \
      | tee -a "$log" | tail -15
    python3 -m pytest -m "gpu and large_memory" -q -p no:cacheprovider 2>&1 | tee -a "$log" | tail -3
    ;;
  repeat)
    for k in $(seq "$2"); do
      ATTNLAB_TEST_MEMORY_LOG=$OUT/memory.txt python3 -m pytest -m "gpu and not large_memory" \
        -k "$3" -q -p no:cacheprovider -n "${4:-12}" -rfE --tb=long > "$OUT/repeat-$k.log" 2>&1
      echo "run $k: $(tail -1 "$OUT/repeat-$k.log")" | tee -a "$log"
    done
    ;;
  bench)
    attnlab bench --host --out "$OUT"
    attnlab bench --seqlens 512,1024,2048,4096,16384 --out "$OUT"
    ;;
  sm90)
    python3 scripts/sm90_candidates.py --out "$OUT" "${@:2}" 2>&1 | grep -v Warning | tee -a "$log"
    ;;
  table)
    python3 scripts/hopper_table.py --out "$OUT" 2>&1 | grep -v Warning | tee -a "$log"
    ;;
  dynamic)
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 tests/test_features_gpu.py \
      -k "dynamic or persistent" 2>&1 | tee -a "$log" | tail -15
    for seqlen in "${@:2}"; do
      python3 scripts/sm90_candidates.py --head-dims 128,256 --masks causal --seqlen "$seqlen" \
        --runs 15 --out "$OUT/$seqlen" 2>&1 | grep -v Warning | tee -a "$log"
    done
    ;;
  masked)
    python3 scripts/sm90_candidates.py --head-dims 64 --masks causal --tokens 12288 \
      --seqlen 1280,1536,1792,2048,2560,3072,3584,4096 --dtypes bfloat16,float16 --runs 15 \
      --variants long_masked_tile_static,dynamic --out "$OUT/masked-hd64" 2>&1 \
      | grep -v Warning | tee -a "$log"
    ;;
  lateo)
    python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_features_gpu.py -k late_o 2>&1 \
      | tee -a "$log" | tail -3
    for args in "64 plain,causal 8192,16384 late_o,late_o_rescale_after" \
                "128 causal 8192,16384 late_o" "32 plain,causal 4096 late_o"; do
      set -- $args
      python3 scripts/sm90_candidates.py --head-dims "$1" --masks "$2" --seqlen "$3" \
        --dtypes bfloat16,float16 --variants "$4" --runs 15 --out "$OUT/lateo-$1" 2>&1 \
        | grep -v Warning | tee -a "$log"
    done
    ;;
  lateprof)
    python3 - "$OUT" <<'PY'
import json, sys
from attnlab import policy
base = policy.default_for("sm_90a", 64, True, seqlen=16384)
for name, cfg in (("default", base), ("late_o", base.replace(late_o_addresses=True))):
    with open(f"{sys.argv[1]}/{name}.json", "w") as f:
        json.dump(cfg.to_dict(), f)
PY
    for name in default late_o; do
      attnlab profile "$OUT/$name.json" --shape 1,16384,16384,32,64 --causal --stalls \
        --peers fa4 --out "$OUT/lateprof-$name"
    done
    ;;
  dtypeprof)
    # fp16 against bf16: our kernels lose 3.8-6.0 % device only from bf16 to fp16 at hd64 plain
    # 4k and hd128 causal 2k-4k, FA4 1.8-2.7 % (fifty-second and fifty-third sessions); the static
    # SASS of both types has the same MMAs, exponentials and FMAs. ncu with stall samples of
    # the default and FA4 in both types, the SM clock beside each (clocks left as found).
    for dtype in bf16 fp16; do
      attnlab profile default --shape 4,4096,4096,32,64 --dtype "$dtype" --stalls \
        --peers fa4 --out "$OUT/dtypeprof-hd64-$dtype"
      attnlab profile default --shape 4,4096,4096,16,128 --causal --dtype "$dtype" --stalls \
        --peers fa4 --out "$OUT/dtypeprof-hd128-causal-$dtype"
    done
    ;;
  power)
    python3 scripts/power_probe.py --out "$OUT/power" "${@:2}" 2>&1 | grep -v Warning | tee -a "$log"
    ;;
  lazy)
    python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_features_gpu.py -k lazy 2>&1 \
      | tee -a "$log" | tail -3
    python3 scripts/sm90_candidates.py --head-dims 64,128 --masks plain,causal \
      --seqlen 4096,16384 --tokens 16384 --dtypes bfloat16,float16 --variants lazy --runs 15 \
      --out "$OUT/lazy" 2>&1 | grep -v Warning | tee -a "$log"
    for c in 64,plain,16384,lazy 128,plain,16384,lazy; do
      python3 scripts/power_probe.py --candidates "$c" --rounds 2 --seconds 1.5 \
        --out "$OUT/lazy-power-${c%%,*}" 2>&1 | grep -v "Warning\|exe_args\|^ " | tee -a "$log"
    done
    ;;
  cluster)
    # A kernel that hangs in its tests would hang the timings too: those run only on a pass.
    timeout -k 10 300 python3 -m pytest -q -p no:cacheprovider -n 6 tests/test_features_gpu.py \
      -k cluster_multicast 2>&1 | tee -a "$log" | tail -3 || exit 1
    python3 scripts/sm90_candidates.py --head-dims 64,128,256 --masks plain \
      --seqlen 4096,8192,16384 --tokens 16384 --dtypes bfloat16,float16 \
      --variants cluster,no_cluster \
      --runs 15 --out "$OUT/cluster" "${@:2}" 2>&1 | grep -v Warning | tee -a "$log"
    for hd in ${CLUSTER_POWER:-128 64}; do
      python3 scripts/power_probe.py --candidates "$hd,plain,16384,cluster+no_cluster" --rounds 2 \
        --seconds 1.5 --out "$OUT/cluster-power-$hd" 2>&1 | grep -v "Warning\|exe_args\|^ " \
        | tee -a "$log"
    done
    ;;
  splittail)
    # A kernel that hangs in its tests would hang the timings too: those run only on a pass.
    timeout -k 10 300 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_features_gpu.py \
      -k "split_tail or cluster_multicast" 2>&1 | tee -a "$log" | tail -3 || exit 1
    python3 scripts/sm90_candidates.py --head-dims 128,256 --masks plain \
      --seqlen 2048,4096,8192,16384 --tokens 16384 --dtypes bfloat16,float16 \
      --variants split_tail --runs 15 --out "$OUT/splittail" "${@:2}" 2>&1 | grep -v Warning \
      | tee -a "$log"
    ;;
  clusterprof)
    cat > "$OUT/cluster_target.py" <<'PY'
import sys

import torch
from flash_attn.cute import flash_attn_func

import attnlab
from attnlab import policy

hd = int(sys.argv[1])
q, k, v = (torch.randn(1, 16384, 2048 // hd, hd, device="cuda", dtype=torch.bfloat16)
           for _ in range(3))
base = policy.default_for("sm_90a", hd)
for _ in range(2):
    for cluster in (1, 2):
        attnlab.attention(q, k, v, config=base.replace(cluster_m=cluster))
    flash_attn_func(q, k, v)
torch.cuda.synchronize()
PY
    metrics=gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_read.sum
    metrics=$metrics,lrc__lrc2xbar_sectors_op_read.sum,lrc__xbar2gpc_sectors_op_read.sum
    metrics=$metrics,l1tex__m_xbar2l1tex_read_bytes.sum,sm__cycles_elapsed.avg
    for hd in 128 64; do
      # The second round's three launches: ours alone, ours in clusters, FA4.
      ncu --clock-control none -k regex:ForwardSm90 --launch-skip 3 -c 3 --metrics "$metrics" \
        python3 "$OUT/cluster_target.py" $hd > "$OUT/ncu-cluster-$hd.txt" 2>&1
      grep -E "ForwardSm90|__|rror" "$OUT/ncu-cluster-$hd.txt" | cut -c1-150 | tee -a "$log"
    done
    ;;
  narrow)
    python3 scripts/sm90_candidates.py --head-dims 32,64,96 --masks causal --seqlen 4096 \
      --runs 15 --out "$OUT/narrow" 2>&1 | grep -v Warning | tee -a "$log"
    ;;
  gemmcand)
    python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_gemm_gpu.py tests/test_conv_gpu.py \
      2>&1 | tee -a "$log" | tail -5
    python3 scripts/gemm_candidates.py --out "$OUT/cand" "${@:2}" 2>&1 | grep -v Warning \
      | tee -a "$log"
    ;;
  gemmpeer)
    shape=${2:-512,512,4096}
    python3 scripts/gemm_peer_probe.py --shape "$shape" 2>&1 | grep -v Warning | tee -a "$log"
    ncu --clock-control none --section LaunchStats --metrics \
gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,\
l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors.sum,\
sm__cycles_active.avg,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \
      -c 6 python3 scripts/gemm_peer_probe.py --shape "$shape" --calls 1 > "$OUT/gemmpeer-ncu.txt" 2>&1
    grep -E "^  [a-zA-Z_]|Cluster|Grid Size|Block Size|gpu__time|lts__|l1tex__|sm__" \
      "$OUT/gemmpeer-ncu.txt" | grep -v "^    ---" | tee -a "$log" | tail -80
    ;;
  ffiargs)
    python3 scripts/ffi_args_probe.py --out "$OUT/ffiargs" 2>&1 | grep -v Warning | tee -a "$log"
    python3 scripts/gemm_host.py --out "$OUT/gemmhost" 2>&1 | grep -v Warning | tee -a "$log"
    ;;
  gemmhost)
    python3 scripts/gemm_host.py --out "$OUT/gemmhost" 2>&1 | grep -v Warning | tee -a "$log"
    ;;
  window)
    attnlab cache --warm --jobs 16
    python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_features_gpu.py \
      -k "sliding or causal" 2>&1 | tee -a "$log" | tail -5
    python3 scripts/window_candidates.py --out "$OUT/window" "${@:2}" 2>&1 \
      | grep -v "Warning\|exe_args" | tee -a "$log"
    ;;
  deccand)
    python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_decode_gpu.py 2>&1 \
      | tee -a "$log" | tail -5
    python3 scripts/decode_candidates.py --out "$OUT/deccand" "${@:2}" 2>&1 \
      | grep -v Warning | tee -a "$log"
    ;;
  dechost)
    python3 scripts/decode_host.py --out "$OUT/dechost" 2>&1 | grep -v Warning | tee -a "$log"
    ;;
  decmerge)
    python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 tests/test_decode_gpu.py 2>&1 \
      | tee -a "$log" | tail -5
    python3 scripts/decode_candidates.py --merge --out "$OUT/decmerge" 2>&1 | grep -v Warning \
      | tee -a "$log"
    ;;
  readprobe)
    python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_ceilings.py -k stream 2>&1 \
      | tee -a "$log" | tail -3
    python3 scripts/read_ceiling.py --probe --out "$OUT/readprobe" "${@:2}" 2>&1 \
      | grep -v Warning | tee -a "$log"
    ;;
  decspans)
    python3 scripts/decode_spans.py --out "$OUT/decspans" "${@:2}" 2>&1 | grep -v Warning \
      | tee -a "$log"
    ;;
  hostab)
    # Host time only: both trees share one kernel cache (their kernels' sources are the same).
    for round in 1 2; do
      for tree in "$2" this; do
        root=$PWD; [ "$tree" = this ] || root=$PWD/.ab/$tree
        for script in decode_host gemm_host; do
          (cd "$root" && PYTHONPATH=$root/src:${PYTHONPATH:-} python3 "scripts/$script.py" \
            --out "$OUT/$tree-$round-$script") 2>&1 | grep -v "Warning\|exe_args" \
            | sed "s/^/$tree $round: /" | tee -a "$log"
        done
      done
    done
    ;;
  regimes)
    python3 scripts/launch_regimes.py --out "$OUT/regimes" "${@:2}" 2>&1 | grep -v Warning \
      | tee -a "$log"
    ;;
  ab|bwdab|decab)
    if [ "$mode" = decab ]; then
      python3 -m pytest -m gpu -q -p no:cacheprovider -n 12 tests/test_decode_gpu.py 2>&1 \
        | tee -a "$log" | tail -5
    fi
    # Each tree in its own process and kernel cache; the forward's A/B labels its own rows.
    for round in 1 2; do
      for tree in "$2" this; do
        src=$PWD/src; [ "$tree" = this ] || src=$PWD/.ab/$tree/src
        if [ "$mode" = ab ]; then
          run=(scripts/ab_forward.py --label "$tree" --out "$OUT/$round"); label=
        elif [ "$mode" = decab ]; then
          run=(scripts/decode_candidates.py --out "$OUT/$tree-$round"); label="$tree: "
        else
          run=(scripts/bwd_candidates.py --out "$OUT/$tree-$round"); label="$tree: "
        fi
        PYTHONPATH=$src:${PYTHONPATH:-} ATTNLAB_CACHE_DIR=/tmp/attnlab-kernels-$tree \
          python3 "${run[@]}" "${@:3}" 2>&1 | grep -v "Warning\|exe_args" \
          | sed "s/^/$label/" | tee -a "$log"
      done
    done
    ;;
  hopper)
    for hd in 64 128; do
      attnlab ladder --family sm90 --head-dim "$hd" --seqlens 1024,4096,16384 --runs 20 \
        --out "$OUT"
    done
    ;;
  ladder)
    attnlab ladder --out "$OUT"
    attnlab ladder --dtype fp16 --seqlens 4096 --out "$OUT/fp16"
    ;;
  backward)
    python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_backward_gpu.py \
      "tests/test_cli_gpu.py::test_bench_backward_times_training_of_attnlab_and_its_peers" \
      2>&1 | tee -a "$log" | tail -25
    attnlab bench --backward --seqlens 2048,8192 --head-dims 64,128 --dtypes bf16,fp16 \
      --out "$OUT"
    ;;
  decode)
    python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_decode_gpu.py 2>&1 \
      | tee -a "$log" | tail -3
    attnlab bench --decode --batches 1,8 --cache-lens 4096,32768 --out "$OUT/decode-a"
    attnlab bench --decode --batches 1 --cache-lens 131072 --out "$OUT/decode-b"
    attnlab bench --decode --batches 64 --cache-lens 4096 --out "$OUT/decode-c"
    ;;
  bwdprof)
    python3 scripts/bwd_profile.py --out "$OUT" "${@:2}" 2>&1 | grep -v Warning | tee -a "$log"
    ;;
  sm80path)
    for dt in bfloat16 float16; do
      python3 scripts/bwd_candidates.py --work forward+backward --variants sm80,sm80_dk_last \
        --dtype "$dt" --out "$OUT/sm80-$dt" 2>&1 | grep -v "Warning\|exe_args" | tee -a "$log"
    done
    ;;
  bwdsweep)
    python3 scripts/bwd_candidates.py --out "$OUT" "${@:2}" 2>&1 | grep -v Warning | tee -a "$log"
    ;;
  gemm)
    python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_gemm_gpu.py 2>&1 | tee -a "$log" \
      | tail -25
    attnlab bench --family gemm --dtypes bf16,fp16 --out "$OUT" "${@:2}"
    attnlab bench --family gemm --dtypes int8 --out "$OUT/int8" \
      --shapes 4096x4096x4096,8192x8192x8192,2048x2048x2048,4096x14336x4096,1024x4096x4096,16x4096x4096
    attnlab ladder --family gemm --dtype bf16 --out "$OUT/ladder"
    ;;
  sparse)
    python3 -m pytest -q -p no:cacheprovider tests/test_gemm_gpu.py -k "sparse or online" 2>&1 \
      | tee -a "$log" | tail -8
    attnlab bench --family sparse --dtypes bf16,fp16 --out "$OUT/sparse"
    attnlab ladder --family sparse --out "$OUT/sparse"
    ;;
  gemmtune)
    shapes=512x512x4096,256x256x4096,256x256x8192,128x128x8192,1x4096x4096t,16x4096x4096t
    attnlab tune --family gemm --dtype bf16 --shapes "$shapes"
    attnlab bench --family gemm --dtypes bf16 --shapes "$shapes" --out "$OUT/tuned"
    ;;
  conv)
    python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_conv_gpu.py 2>&1 | tee -a "$log" \
      | tail -8
    attnlab bench --family conv --dtypes bf16 --out "$OUT/conv"
    attnlab ladder --family conv --out "$OUT/conv"
    ;;
  study)
    python3 -m pytest -q -p no:cacheprovider tests/test_cli_gpu.py -k cymatic 2>&1 \
      | tee -a "$log" | tail -5
    attnlab study cymatic --grids 2048,8192 --modes 6x4,5x4 --out "$OUT/cymatic"
    ;;
  sweep)
    attnlab study cymatic --grids "${2:-6144}" --sweep --runs 7 --out "$OUT/cymatic-sweep"
    ;;
  fastudy)
    python3 -m pytest -q -p no:cacheprovider tests/test_cli_gpu.py -k cymatic 2>&1 \
      | tee -a "$log" | tail -3
    modes=$(for n in 3 5 6 7 9; do for m in 2 4 6; do printf '%sx%s,' $n $m; done; done)
    attnlab study cymatic --grids 6144 --fa --modes "${modes%,}" --runs 7 --out "$OUT/cymatic-fa"
    ;;
  frontends)
    python3 -m pytest -q -p no:cacheprovider tests/test_study_frontends.py \
      tests/test_analysis_cubin_patch.py -m gpu 2>&1 | tee -a "$log" | tail -5
    attnlab study frontends --run --out "$OUT/frontends"
    attnlab patch cuda:igemm_tile --runs 60 --out "$OUT/patch"
    attnlab patch cuda:hgemm_tile --runs 60 --out "$OUT/patch"
    ;;
  explain)
    attnlab profile k07 --out "$OUT"
    attnlab roofline k02 k07 --out "$OUT"
    ;;
  profile)
    for shape in 4,4096,4096,32,64 4,4096,4096,8,256; do
      attnlab profile default --shape "$shape" --causal --peers sdpa_cudnn,fa4 --out "$OUT"
    done
    ;;
  *) echo "unknown mode $mode (test|bench|backward|sm80path|decode|bwdab|bwdprof|bwdsweep|sm90|table|hopper|ladder|gemm|gemmhost|gemmtune|sparse|conv|study|sweep|fastudy|frontends|explain|profile|dechost|ab|dynamic|narrow)"; exit 2 ;;
esac
