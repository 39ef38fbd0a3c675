"""Per-role profiles: interpolation, capacities, the curves derived from the shipped simulator
profile (the engine measured on this machine), JSON round trip, clear errors."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenmill.disagg.role_profile import (DecodeCurve, PrefillCurve, RoleProfile, interp, load_role_profile,
                                           main)


@given(xs=st.lists(st.floats(1, 1e4), min_size=2, max_size=8, unique=True), x=st.floats(0, 2e4),
       data=st.data())
def test_interp_stays_between_neighbours(xs, x, data):
    xs = sorted(xs)
    ys = data.draw(st.lists(st.floats(0.001, 10), min_size=len(xs), max_size=len(xs)))
    y = interp(xs, ys, x)
    if x <= xs[0]:
        assert y == ys[0]
    elif x <= xs[-1]:
        i = next(i for i in range(1, len(xs)) if x <= xs[i])
        assert min(ys[i - 1], ys[i]) - 1e-9 <= y <= max(ys[i - 1], ys[i]) + 1e-9


def test_shipped_profile_curves_are_sane():
    prof = load_role_profile()  # derived from sim/profiles/cpu_smollm2_135m.json
    ttft = [prof.prefill.ttft(i) for i in (64, 256, 1024, 4096)]
    assert ttft == sorted(ttft) and ttft[-1] > 10 * ttft[0]  # longer prompts take longer
    for c in (128, 1024, 4096):
        itl = [prof.decode.itl(b, c) for b in (1, 8, 64)]
        assert itl == sorted(itl)  # a bigger batch: a longer step ...
        assert 64 / itl[2] > 1 / itl[0]  # ... but more tokens/s
    assert prof.decode.itl(8, 4096) > prof.decode.itl(8, 128)  # a longer context: a longer step
    # a looser ITL target or a shorter context lets one engine decode more
    assert prof.decode.capacity(512, 0.2) >= prof.decode.capacity(512, 0.05)
    assert prof.decode.capacity(256, 0.1) >= prof.decode.capacity(4096, 0.1)


def test_json_round_trip_and_cli(tmp_path):
    out = tmp_path / "role.json"
    assert main(["--out", str(out), "--kv-tokens", "8000"]) == 0
    prof = load_role_profile(out)
    assert prof.decode.kv_tokens == 8000
    assert RoleProfile.from_json(prof.to_json()) == prof
    with pytest.raises(ValueError, match="decode.context"):
        RoleProfile.from_json({"prefill": {"isl": [1, 2], "ttft_s": [1, 2]}})
    bad = json.loads(out.read_text())
    bad["prefill"]["isl"] = [5, 3]
    with pytest.raises(ValueError, match="strictly increasing"):
        RoleProfile.from_json(bad)


def test_curves_check_their_tables():
    with pytest.raises(ValueError, match="one positive value per"):
        PrefillCurve((1.0, 2.0), (0.1,))
    with pytest.raises(ValueError, match="one row per context"):
        DecodeCurve((1.0, 2.0), (1.0, 2.0), ((0.1, 0.2),), kv_tokens=10)


def test_planner_modules_are_torch_free():
    """The planner, its profiles and the simulator's elastic mode import no torch (a fresh process)."""
    import subprocess
    import sys
    code = ("import sys, tokenmill.disagg.sla_planner, tokenmill.disagg.role_profile, tokenmill.disagg.load_window, "
            "tokenmill.sim.elastic; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
