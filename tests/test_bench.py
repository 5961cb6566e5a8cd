"""The measuring half without a GPU: timing statistics, FLOPs, ratios, reports, JSON, plots."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from attnlab.bench.report import (
    bench_table,
    ladder_rows,
    ladder_table,
    load_results,
    plot_bench,
    plot_ladder,
    reference_tflops,
    write_json,
)
from attnlab.bench.runner import (
    CROSS_SHAPES,
    REFERENCE,
    Point,
    Result,
    cross_grid,
    harmonic_mean,
    ratios,
    tokens_grid,
)
from attnlab.bench.timing import (
    HOLD_MS_PER_CALL,
    Timing,
    attention_flops,
    round_orders,
    summarize,
    tflops,
    time_calls,
    window_pairs,
)


class FakeClock:
    """Each call of the timed function advances time by a scripted amount (ms)."""

    def __init__(self, durations: list[float]):
        self.now = 0.0
        self.durations = iter(durations)
        self.waits = 0
        self.holds: list[tuple[float, float]] = []  # (when, ms)

    def advance(self) -> None:
        self.now += next(self.durations)

    def mark(self) -> float:
        return self.now

    def wait(self) -> None:
        self.waits += 1

    def elapsed_ms(self, start: float, stop: float) -> float:
        return stop - start

    def hold(self, ms: float) -> None:
        self.holds.append((self.now, ms))


def test_time_calls_skips_warmup_and_rotates_inputs():
    clock = FakeClock([100.0, 100.0] + [3.0, 1.0, 2.0, 5.0, 4.0])
    seen = []

    def fn(i):
        seen.append(i)
        clock.advance()

    timing = time_calls(fn, warmup=2, runs=5, rotations=3, clock=clock)
    assert seen == [0, 1, 2, 0, 1, 2, 0]  # warm-ups, then timed runs: each call the next set
    assert timing == Timing(median_ms=3.0, min_ms=1.0, max_ms=5.0, runs=5)
    assert clock.waits == 2  # once before the timed runs, once before reading the marks
    # One hold, after the warm-ups and before the first timed call, sized for every call.
    assert clock.holds == [(200.0, 5 * HOLD_MS_PER_CALL)]


def test_timed_calls_run_with_the_garbage_collector_paused():
    """A collection during the timed calls would stall the host past the device hold."""
    import gc

    clock = FakeClock([1.0] * 4)
    states = []

    def fn(i):
        states.append(gc.isenabled())
        clock.advance()

    assert gc.isenabled()
    time_calls(fn, warmup=1, runs=3, clock=clock)
    assert states == [True, False, False, False]
    assert gc.isenabled()


@pytest.mark.parametrize("count", range(1, 9))
def test_round_orders_balance_places_and_predecessors(count):
    """Over a full cycle every function holds every place of a round equally often and
    follows every other function (within a round) equally often."""
    from collections import Counter

    cycle = count if count % 2 == 0 else 2 * count
    orders = round_orders(count, 3 * cycle)
    assert orders[:cycle] == orders[cycle:2 * cycle]
    for order in orders:
        assert sorted(order) == list(range(count))
    places = Counter((place, f) for order in orders[:cycle] for place, f in enumerate(order))
    assert set(places.values()) == {cycle // count}
    pairs = Counter(pair for order in orders[:cycle]
                    for pair in zip(order[:-1], order[1:], strict=True))
    if count > 1:
        assert len(pairs) == count * (count - 1) and len(set(pairs.values())) == 1
    with pytest.raises(ValueError):
        round_orders(0, 3)


def test_measure_point_times_round_robin():
    """Rounds alternate direction: a GPU slowing down over a point (here every call takes
    1 ms longer than the one before) favours no implementation; a failing implementation
    is a row with its error, whether it fails on its first call or while being timed."""
    import torch

    from attnlab.bench.runner import measure_point

    log = []
    clock = FakeClock(float(n) for n in range(1, 10_000))

    def impl(name, fail_at=None):
        def run(q, k, v, scale, causal):
            log.append(name)
            if log.count(name) == fail_at:
                raise RuntimeError("lost the device")
            clock.advance()
        return run

    def broken(q, k, v, scale, causal):
        raise RuntimeError("no kernel")

    finished = []
    impls = {"a": impl("a"), "broken": broken, "flaky": impl("flaky", fail_at=3),
             "b": impl("b")}
    sets = [(torch.zeros(1),) * 3] * 3
    point = Point(1, 128, 128, 1, 64)
    results = measure_point(point, impls, runs=4, warmup=1, sets=sets, clock=clock,
                            on_impl=finished.append)
    # First calls; a first device-only attempt that "flaky" ends; then a, b again: one
    # warm-up round and 4 timed rounds, alternating direction; then the end-to-end rounds the
    # same way (one call per span: each fake call lasts far longer than a span needs).
    timed_rounds = ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert log == (["a", "flaky", "b"] + ["a", "flaky", "b"] + ["a", "flaky"]
                   + timed_rounds + timed_rounds)
    by_name = {r.impl: r for r in results}
    assert [r.impl for r in results] == ["a", "broken", "flaky", "b"]
    assert "no kernel" in by_name["broken"].error and by_name["broken"].timing is None
    assert "lost the device" in by_name["flaky"].error and by_name["flaky"].timing is None
    for timing in ("timing", "device_timing"):
        a, b = getattr(by_name["a"], timing), getattr(by_name["b"], timing)
        assert a.runs == b.runs == 4
        assert a.median_ms == b.median_ms
    # The end-to-end calls came after the device-only ones: longer, on the slowing clock.
    assert by_name["a"].timing.median_ms > by_name["a"].device_timing.median_ms
    assert sorted(finished) == ["a", "b", "broken", "flaky"]


def test_back_to_back_spans_divide_by_their_calls_and_drain_first():
    """End to end: each span holds its calls back to back, with the device drained before
    it (nothing queued earlier may hide the host side), and reports ms per call."""
    from attnlab.bench.timing import calls_per_span, sample_back_to_back

    clock = FakeClock([1.0] * 2 + [0.5] * 12)
    seen = []

    def fn(i):
        seen.append(i)
        clock.advance()

    samples = sample_back_to_back({"f": fn}, calls={"f": 4}, rounds=3, warmup=2,
                                  rotations=3, clock=clock)
    assert samples == {"f": [0.5, 0.5, 0.5]}
    assert seen == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1]
    assert clock.waits == 6  # before and after each span
    assert calls_per_span(0.01) == 50 and calls_per_span(0.5) == 4 and calls_per_span(9) == 1


@pytest.mark.parametrize("runs,warmup,rotations", [(0, 1, 1), (5, -1, 1), (5, 1, 0)])
def test_time_calls_rejects_bad_counts(runs, warmup, rotations):
    with pytest.raises(ValueError):
        time_calls(lambda i: None, runs=runs, warmup=warmup, rotations=rotations,
                   clock=FakeClock([]))


def test_summarize_even_count_median_and_empty():
    assert summarize([4.0, 1.0, 2.0, 3.0]).median_ms == 2.5
    with pytest.raises(ValueError):
        summarize([])


def test_flops_and_tflops():
    # The issue's headline shape: 16k tokens at seq 4096 (B=4), 16 heads of 128.
    flops = attention_flops(4, 16, 4096, 4096, 128)
    assert flops == 4 * 4 * 16 * 4096 * 4096 * 128
    assert attention_flops(4, 16, 4096, 4096, 128, causal=True) == flops / 2
    assert tflops(flops, 1.0) == pytest.approx(flops / 1e-3 / 1e12)


def test_harmonic_mean():
    assert harmonic_mean([1.0, 2.0]) == pytest.approx(4 / 3)
    assert harmonic_mean([0.9] * 6) == pytest.approx(0.9)
    for bad in ([], [1.0, 0.0], [1.0, -2.0]):
        with pytest.raises(ValueError):
            harmonic_mean(bad)


def test_cross_grid_is_the_seed_shapes_with_sq_not_sk():
    points = cross_grid(8, 8, [64, 128], ["bfloat16"])
    assert [(p.seqlen_q, p.seqlen_k) for p in points] == list(CROSS_SHAPES) * 2
    assert all(p.seqlen_q != p.seqlen_k and not p.causal for p in points)
    assert CROSS_SHAPES == ((256, 77), (1024, 256), (4096, 77))


def test_tokens_grid_keeps_tokens_and_hidden():
    points = tokens_grid(16384, 2048, [512, 16384], [64, 128], ["bfloat16"])
    assert [(p.batch, p.seqlen_q, p.heads, p.head_dim) for p in points] == [
        (32, 512, 32, 64), (1, 16384, 32, 64), (32, 512, 16, 128), (1, 16384, 16, 128)]
    assert all(p.kv_heads == p.heads and not p.causal for p in points)


def test_tokens_grid_causal_and_gqa():
    points = tokens_grid(16384, 2048, [4096], [128], ["bfloat16"], (False, True), gqa_group=4)
    assert [(p.causal, p.heads, p.kv_heads) for p in points] == [(False, 16, 4), (True, 16, 4)]
    assert points[1].flops == points[0].flops / 2
    assert "H=16/4" in points[0].label() and "causal" in points[1].label()


def fake_results(speed: dict[str, dict[int, float]]) -> list[Result]:
    """Results whose median ms is 1 / speed (so the ratio to the reference is the speed)."""
    results = []
    for impl, per_seq in speed.items():
        for seqlen, s in per_seq.items():
            point = Point(16384 // seqlen, seqlen, seqlen, 16, 128)
            ms = 1.0 / s
            # End to end: the device time plus 10 % of host time.
            results.append(Result(point, impl, Timing(1.1 * ms, ms, ms * 1.3, 30),
                                  device_timing=Timing(ms, ms * 0.9, ms * 1.2, 30)))
    return results


SPEEDS = {REFERENCE: {1024: 1.0, 4096: 1.0}, "k01": {1024: 0.2, 4096: 0.25},
          "k02": {1024: 0.6, 4096: 0.8}}


def test_ratios_are_per_point_against_the_reference():
    r = ratios(fake_results(SPEEDS))
    point = Point(4, 4096, 4096, 16, 128)
    assert r[(point, "k02")] == pytest.approx(0.8)
    assert r[(point, REFERENCE)] == pytest.approx(1.0)


def test_ladder_rows_percent_harmonic_mean_and_delta():
    rows = ladder_rows(fake_results(SPEEDS), {"k01": "base", "k02": "swizzling"}, anchor=4096)
    assert [r.name for r in rows] == ["k01", "k02"]
    assert rows[0].pct_at_anchor == pytest.approx(25.0)
    assert rows[0].harmonic_mean_pct == pytest.approx(harmonic_mean([20.0, 25.0]))
    assert rows[0].delta_pct is None
    assert rows[1].delta_pct == pytest.approx(55.0)


def render(table) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


def test_tables_show_tflops_and_ratios():
    results = fake_results(SPEEDS)
    text = render(bench_table(results, "t"))
    assert "k02" in text and "0.800x" in text and "0.250x" in text
    # Against another reference (a sliding window's bench: FA4): 0.25 / 0.8 at 4k.
    text = render(bench_table(results, "t", reference="k02"))
    assert "/ k02" in text and "0.312x" in text and "1.250x" in text
    rows = ladder_rows(results, {"k01": "base", "k02": "swizzling"})
    ref = reference_tflops(results)
    # End to end: the fake results' 1.1 ms per call at speed 1.
    assert ref == pytest.approx(Point(4, 4096, 4096, 16, 128).flops / 1.1e-3 / 1e12)
    text = render(ladder_table(rows, ref, "t"))
    assert "80.0%" in text and "+55.0" in text and f"{ref:.1f}" in text


def test_failed_implementation_is_a_row_not_a_crash():
    point = Point(4, 4096, 4096, 16, 128)
    results = fake_results({REFERENCE: {4096: 1.0}})
    results.append(Result(point, "peer", None, "RuntimeError: no kernel"))
    assert "failed" in render(bench_table(results, "t"))
    assert (point, "peer") not in ratios(results)


def test_json_round_trip_and_schema(tmp_path):
    results = fake_results(SPEEDS)
    rows = ladder_rows(results, {"k01": "base"})
    path = write_json(tmp_path / "x.json", "ladder", results, rows=rows)
    payload = json.loads(path.read_text())
    assert payload["schema"] == 2 and payload["kind"] == "ladder"
    assert payload["reference"] == REFERENCE
    assert {"torch", "python", "cutlass_dsl"} <= set(payload["environment"])
    first = payload["results"][0]
    assert set(first) == {"point", "impl", "timing", "tflops", "error", "device_timing",
                          "device_tflops"}
    assert set(first["timing"]) == {"median_ms", "min_ms", "max_ms", "runs"}
    assert first["device_tflops"] > first["tflops"]
    assert payload["rows"][0]["name"] == "k01"
    assert load_results(path) == results


def test_schema_1_files_load_as_device_only(tmp_path):
    """Before schema 2 the one timing was device only (queued behind a device hold)."""
    results = fake_results(SPEEDS)
    payload = json.loads(write_json(tmp_path / "x.json", "bench", results).read_text())
    payload["schema"] = 1
    for r in payload["results"]:
        r["timing"] = r.pop("device_timing")
        del r["device_tflops"]
    (tmp_path / "old.json").write_text(json.dumps(payload))
    loaded = load_results(tmp_path / "old.json")
    assert [r.device_timing for r in loaded] == [r.device_timing for r in results]
    assert all(r.timing is None for r in loaded)


def test_load_rejects_other_schemas(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"schema": 99, "results": []}))
    with pytest.raises(ValueError, match="schema"):
        load_results(path)


def test_plots_are_pngs(tmp_path):
    results = fake_results(SPEEDS)
    for path in (plot_bench(results, tmp_path / "b.png"),
                 plot_ladder(ladder_rows(results, {"k01": "a", "k02": "b"}),
                             tmp_path / "l.png")):
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_ladder_rows_variant_delta_is_against_its_base():
    speeds = {**SPEEDS, "pad8": {1024: 0.5, 4096: 0.7}}
    rows = ladder_rows(fake_results(speeds), {"k01": "a", "k02": "b", "pad8": "variant"},
                       bases={"pad8": "k01"})
    assert rows[2].delta_pct == pytest.approx(70.0 - 25.0)


def test_attnlab_impl_is_attention_as_a_user_calls_it(recorder):
    """The benchmarked call allocates its output (as an eager caller's does), takes the
    config, and turns causal into the causal window."""
    import torch

    from attnlab.bench.runner import attnlab_impl
    from attnlab.config import FlashConfig

    config = FlashConfig(block_n=32)
    run = attnlab_impl(config)
    storage = torch.randn(4 * 64 * 2 * 32, dtype=torch.float16)
    outputs = []
    for batch, seqlen, causal in ((4, 64, False), (1, 256, True), (1, 256, True)):
        q = storage.view(batch, seqlen, 2, 32)
        outputs.append(run(q, q, q, 0.25, causal))
        launch = recorder.launches[-1]
        assert launch["out"] is outputs[-1] and outputs[-1].shape == q.shape
        assert launch["lse"] is None  # no LSE asked for: none written
        assert launch["config"] is config and launch["softmax_scale"] == 0.25
        assert launch["window"] == ((-1, 0) if causal else (-1, -1))
    assert outputs[1] is not outputs[2]
    run(q, q, q, 0.25, (16, 3))
    assert recorder.launches[-1]["window"] == (16, 3)


def test_dispatched_impl_chooses_once_per_call_signature(recorder):
    """Without a config the call's signature (mask included) picks the config once: a
    causal point gets the masked problem, repeated calls reuse the choice."""
    import torch

    from attnlab.bench.runner import attnlab_impl

    run = attnlab_impl()
    q = torch.randn(2, 64, 2, 32, dtype=torch.float16)
    for causal in (False, True, True, False):
        run(q, q, q, 0.25, causal)
    assert [p.window for p in recorder.problems] == [(-1, -1), (-1, 0)]
    assert len(recorder.launches) == 4


def test_work_flops_and_labels():
    forward = Point(2, 512, 512, 4, 64)
    both = Point(2, 512, 512, 4, 64, work="forward+backward")
    alone = Point(2, 512, 512, 4, 64, work="backward", causal=True)
    assert both.flops == 3.5 * forward.flops
    assert alone.flops == 2.5 * forward.flops / 2
    assert forward.label() + " forward+backward" == both.label()
    assert alone.label().endswith("causal backward")
    with pytest.raises(ValueError, match="work must be one of"):
        Point(2, 512, 512, 4, 64, work="bwd")


def test_window_points_count_the_pairs_inside_and_read_back():
    """A sliding window's FLOPs count the (query, key) pairs it lets through, bottom-right
    aligned as FlashAttention's windows are; a window replaces causal; JSON gives it back."""
    from dataclasses import asdict

    assert window_pairs(8, 8, (-1, -1)) == 64
    assert window_pairs(8, 8, (-1, 0)) == 36
    assert window_pairs(8, 8, (2, 0)) == 1 + 2 + 3 * 6
    assert window_pairs(8, 8, (1, 1)) == 2 + 3 * 6 + 2
    assert window_pairs(2, 4, (0, 0)) == 2  # rows see keys 2 and 3
    assert window_pairs(4, 2, (-1, 0)) == 0 + 0 + 1 + 2  # the first two rows see no key
    assert window_pairs(4, 2, (0, -1)) == 2 + 2 + 2 + 1
    point = Point(2, 8, 8, 4, 64, window=(2, 0))
    assert point.flops == 4.0 * 2 * 4 * 64 * 21 and point.mask == (2, 0)
    assert point.label().endswith("Sq=8 Sk=8 window (2, 0)")
    assert Point(2, 8, 8, 4, 64, causal=True).mask is True
    assert Point(**{**asdict(point), "window": [2, 0]}) == point
    with pytest.raises(ValueError, match="replaces causal"):
        Point(2, 8, 8, 4, 64, causal=True, window=(2, 0))


@given(st.integers(1, 300), st.integers(1, 300), st.integers(-1, 400), st.integers(-1, 400))
def test_window_pairs_are_the_reference_masks_keys(seqlen_q, seqlen_k, left, right):
    """The pairs counted for a window's FLOPs are the keys ``reference.window_mask`` lets
    through, every shape and side (the full window: all of them)."""
    from attnlab.reference import window_mask

    mask = window_mask(seqlen_q, seqlen_k, (left, right))
    expected = seqlen_q * seqlen_k if mask is None else int(mask.sum())
    assert window_pairs(seqlen_q, seqlen_k, (left, right)) == expected


def test_peers_take_a_window_or_refuse_it():
    """attnlab takes a point's window as ``window_size``; torch SDPA, which has none, refuses
    it (a row's error, not a causal or full result)."""
    import torch

    from attnlab.bench.baselines import sdpa

    q = torch.randn(1, 8, 2, 32, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="no sliding window"):
        sdpa("sdpa_flash")(q, q, q, 0.25, (4, 0))


def _reference_attention(calls):
    """A differentiable attention on the CPU (what a peer is to training_impl)."""
    import torch

    def run(q, k, v, scale, causal):
        calls.append(q.shape)
        scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
        return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v.float()).to(q.dtype)

    return run


def test_training_impl_times_a_backward_with_fresh_or_kept_graphs():
    """forward+backward runs the forward every call; backward builds one graph per input set
    and differentiates it again (retain_graph); the gradients match autograd's; one dO per
    output shape; an implementation whose backward raises fails on its first call."""
    import torch

    from attnlab.bench.runner import training_impl

    gen = torch.Generator().manual_seed(0)
    sets = [tuple(torch.randn(1, 16, 2, 8, generator=gen) for _ in range(3)) for _ in range(2)]
    calls: list = []
    both = training_impl(_reference_attention(calls), "forward+backward")
    alone = training_impl(_reference_attention(calls), "backward")
    for _ in range(2):
        for s in sets:
            grads = both(*s, 0.3, False)
    assert len(calls) == 4 and [g.shape for g in grads] == [t.shape for t in sets[1]]
    calls.clear()
    first = [alone(*s, 0.3, False) for s in sets]
    again = [alone(*s, 0.3, False) for s in sets]
    assert len(calls) == 2  # one forward per input set
    for a, b in zip(first, again, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    # The same gradients as autograd's, for the dO the wrapper drew (seeded alike).
    torch.manual_seed(7)
    grads = training_impl(_reference_attention([]), "forward+backward")(*sets[0], 0.3, False)
    torch.manual_seed(7)
    leaves = [t.clone().requires_grad_() for t in sets[0]]
    out = _reference_attention([])(*leaves, 0.3, False)
    expected = torch.autograd.grad(out, leaves, torch.randn_like(out))
    assert all(torch.equal(g, e) and g.abs().sum() > 0
               for g, e in zip(grads, expected, strict=True))

    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError("no backward")

    broken = training_impl(lambda q, k, v, scale, causal: NoBackward.apply(q), "backward")
    with pytest.raises(NotImplementedError, match="no backward"):
        broken(*sets[0], 0.3, False)
    with pytest.raises(ValueError, match="times a backward"):
        training_impl(_reference_attention([]), "forward")


def test_paged_over_contiguous_reads_the_unrounded_timings():
    """0.949 stays 0.949 (a table of rounded GB/s read 100 / 105 = 0.952 once)."""
    from attnlab.bench.decode import paged_over_contiguous
    from attnlab.bench.runner import Result

    point = Point(1, 1, 4096, 8, 128, heads_kv=1)

    def result(impl, e2e_ms, device_ms):
        return Result(point, impl, Timing(e2e_ms, e2e_ms, e2e_ms, 30),
                      device_timing=Timing(device_ms, device_ms, device_ms, 30))

    mine = {"attnlab": result("attnlab", 1.0, 0.5),
            "attnlab_paged": result("attnlab_paged", 1.0 / 0.949, 0.5 / 1.024)}
    e2e, device = paged_over_contiguous(mine)
    assert e2e == pytest.approx(0.949) and device == pytest.approx(1.024)
    assert paged_over_contiguous({"attnlab": mine["attnlab"]}) is None
    mine["attnlab_paged"] = Result(point, "attnlab_paged", None, error="no kernel")
    assert paged_over_contiguous(mine) is None


def test_decode_points_too_large_for_the_gpu_are_skipped_with_their_sizes():
    """B = 64 x 128k GQA (34 GB of K and V, twice with the paged copy) cannot be built on an
    80 GB GPU: the bench says so for that point instead of dying in an allocation; a point
    that fits passes."""
    from attnlab.bench.decode import decode_points, inputs_too_large, kv_bytes, set_count

    l2 = 50 * 2**20
    big, small = decode_points([64, 1], [131072], [(32, 8)])
    assert kv_bytes(big) == 2 * 64 * 131072 * 8 * 128 * 2 and set_count(big, l2) == 1
    reason = inputs_too_large(big, l2, 78 * 2**30)
    assert reason is not None and "80.0 GiB" in reason and "78.0 GiB are free" in reason
    assert inputs_too_large(small, l2, 78 * 2**30) is None
    # Small points take several sets (together past L2) and are sized for all of them.
    tiny = decode_points([1], [4096], [(8, 1)])[0]
    assert set_count(tiny, l2) > 1
    assert inputs_too_large(tiny, l2, set_count(tiny, l2) * kv_bytes(tiny)) is not None


def test_decode_scripts_read_points_as_batch_keys_and_heads():
    from attnlab.bench.decode import parse_points

    assert parse_points("1:131072:8:1,64:4096:32:8") == ((1, 131072, 8, 1), (64, 4096, 32, 8))
    with pytest.raises(ValueError):
        parse_points("1:4k:8:1")
