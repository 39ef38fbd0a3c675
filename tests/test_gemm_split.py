"""How the GEMM kernels spread over the threads (csrc/gemm_split.h): the grid of column-unit and row
slices keeps every thread of a many-core server busy on prompt-sized calls and never does worse than
whole columns; and every GEMM kernel gives the same bits on 1 thread and on many (tolerance 0: a
row's sums do not depend on which task computes it), at every kernel level this CPU runs. Thread
counts above this machine's cores only oversubscribe it, which changes the tasks, not the sums."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.kernels import cpu_ops
from tokenmill.quant.blocks import pack, quantize_int4, quantize_q8

pytestmark = pytest.mark.skipif(not cpu_ops.load(), reason="the C++ kernels did not build here")
MIN_SLICE_ROWS = 8  # kMinSliceRows


def split(units: int, m: int, threads: int, min_units: int) -> tuple[int, int]:
    u, r = torch.ops.tokenmill.gemm_split(units, m, threads, min_units)
    return u, r


@settings(max_examples=400, deadline=None)
@given(units=st.integers(1, 5000), m=st.integers(1, 6000), threads=st.integers(1, 256),
       min_units=st.integers(1, 4))
def test_split_is_a_grid_that_fits_the_threads(units, m, threads, min_units):
    u, r = split(units, m, threads, min_units)
    assert 1 <= u <= min(threads, units) and r >= 1 and u * r <= threads
    whole_columns = min(threads, math.ceil(units / min_units))
    if m < 2 * MIN_SLICE_ROWS:  # decode-sized: whole columns, min_units a task at least
        assert (u, r) == (whole_columns, 1)
        return
    assert r <= m // MIN_SLICE_ROWS
    largest = math.ceil(units / u) * math.ceil(m / r)
    assert largest <= math.ceil(units / whole_columns) * m  # never worse than cutting columns alone
    if m >= MIN_SLICE_ROWS * threads:  # within 2x of a perfect share, however few the units
        assert largest <= 2 * units * m / threads + 1


def test_split_of_the_default_models_layers():
    """o_proj / down_proj of SmolLM2-135M as int4 groups: 36 groups of 16 columns, at least 4 a task."""
    assert split(36, 1024, 32, 4) == (4, 8)  # a prompt chunk: all 32 threads, 9 groups x 128 rows each
    assert split(36, 1, 32, 4) == (9, 1)  # a decode: columns only, as before
    assert split(36, 1024, 2, 4) == (2, 1)  # 2 threads: columns only, as before
    assert split(15, 1024, 2, 1) == (1, 2)  # an odd number of units on 2 threads: half the rows each


@pytest.fixture
def restore():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    cpu_ops.set_isa("auto")


@pytest.mark.parametrize("level", cpu_ops.LEVELS)
def test_gemms_give_the_same_bits_on_any_thread_count(level, restore):
    if level not in cpu_ops.runnable_levels():
        pytest.skip(f"this CPU cannot run {level}")
    cpu_ops.set_isa(level)
    ops = torch.ops.tokenmill
    g = torch.Generator().manual_seed(3)
    k, n, inter = 64, 200, 96  # 200 columns: a partial last panel and group
    w, w_sw = torch.randn(n, k, generator=g), torch.randn(2 * inter, k, generator=g)
    bias = torch.randn(n, generator=g)
    f32, bf16 = ops.pack_panels(w), ops.pack_bf16_panels(w.bfloat16())
    bf16_sw = ops.pack_bf16_panels(w_sw.bfloat16())
    q4, q8 = pack(quantize_int4(w, 32)), pack(quantize_q8(w))
    gemms = {
        "panel_linear": lambda x: ops.panel_linear(x, f32, n, bias),
        "bf16_panel_linear": lambda x: ops.bf16_panel_linear(x, bf16, n, bias),
        "bf16_swiglu": lambda x: ops.bf16_swiglu(x, bf16_sw, inter),
        "bf16_argmax_linear": lambda x: ops.bf16_argmax_linear(x, bf16, n, n - 3),
        "q4_linear": lambda x: ops.q4_linear(x, q4, n, bias),
        "q8_linear": lambda x: ops.q8_linear(x, q8, n, None),
        "q_argmax_linear 4": lambda x: ops.q_argmax_linear(x, q4, 4, n, n - 3),
        "q_argmax_linear 8": lambda x: ops.q_argmax_linear(x, q8, 8, n, n),
    }
    for m in (1, 5, 16, 37, 130):
        x = torch.randn(m, k, generator=g)
        torch.set_num_threads(1)
        ref = {name: f(x) for name, f in gemms.items()}
        for threads in (2, 3, 7, 16):
            torch.set_num_threads(threads)
            for name, f in gemms.items():
                assert torch.equal(f(x), ref[name]), (name, m, threads)
