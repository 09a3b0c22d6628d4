"""The calibrated cost model: the knee fit recovers what it should, the JSON file round-trips, a bad file is one
line, and `sim.run` / `python -m sim run --cost-model` price steps with it."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sim.api import run
from sim.clock.cost import CalibratedCostModel, PiecewiseCostModel
from sim.clock.cost_file import cost_model_for, cost_model_record, read_cost_model, write_cost_model
from sim.testing.blocks import machine_settings

ROOT = Path(__file__).resolve().parents[2]
TRUTH = CalibratedCostModel(a=0.02, b=0.003, c=0.0025, d=2e-6, floor_s=0.04)


def _rows(model: CalibratedCostModel, noise: float = 0.0, seed: int = 0) -> list[tuple]:
    """Steps of a designed spread: small decodes under the knee, large prefills above it, long contexts."""
    rng = np.random.default_rng(seed)
    shapes = [(0, s, s * c) for s in (1, 2, 4, 8, 16, 32, 64) for c in (20, 200, 1000)]
    shapes += [(p, 0, p) for p in (8, 32, 128, 512, 1536)] + [(240, 16, 1000 + 240 * k) for k in range(5)]
    return [(p, s, c, model.step_time(p, s, c) * (1 + noise * rng.standard_normal())) for p, s, c in shapes]


def test_knee_fit_recovers_a_known_model():
    fitted = CalibratedCostModel.fit(_rows(TRUTH), with_floor=True)
    # the floor is found on a grid of 1% of the median step time; the slopes then come out nearly exact
    assert fitted.floor_s == pytest.approx(TRUTH.floor_s, rel=0.05)
    for name in ("b", "c", "d"):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUTH, name), rel=0.05), name
    for p, s, c, t in _rows(TRUTH):
        assert fitted.step_time(p, s, c) == pytest.approx(t, rel=0.03)


def test_knee_fit_beats_a_straight_line_on_knee_shaped_data():
    rows = _rows(TRUTH, noise=0.03)
    knee, line = CalibratedCostModel.fit(rows, with_floor=True), CalibratedCostModel.fit(rows)

    def median_error(model):
        return np.median([abs(model.step_time(p, s, c) - t) / t for p, s, c, t in rows])

    assert median_error(knee) < 0.05 < median_error(line)


def test_slopes_are_never_negative():
    # steps whose time falls with the context: a least-squares line would take a negative d; the fit pins it to 0
    rows = [
        (p, s, c, 0.05 + 0.003 * p + 0.002 * s - 1e-7 * c)
        for p in (0, 64)
        for s in (1, 4, 16, 64)
        for c in (100, 5000, 20000)
    ]
    fitted = CalibratedCostModel.fit(rows, with_floor=True)
    assert fitted.d == 0.0 and fitted.b >= 0 and fitted.c > 0


def test_floor_is_validated():
    with pytest.raises(ValueError, match="floor_s must be >= 0"):
        CalibratedCostModel(0.0, 0.0, 0.0, 0.0, floor_s=-1.0)


def _write(tmp_path, model=TRUTH, name="smollm2-135m", **about) -> Path:
    path = tmp_path / "cost.json"
    write_cost_model(path, cost_model_record(model, name, **about))
    return path


def test_file_round_trips(tmp_path):
    path = _write(tmp_path, machine={"cpu": "test"})
    model, record = read_cost_model(path)
    assert model == TRUTH and record["machine"] == {"cpu": "test"}
    assert cost_model_for(path, "smollm2-135m") == TRUTH


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: "not json", "not JSON"),
        (lambda r: {**r, "format": "other"}, 'expected a JSON object with "format"'),
        (lambda r: {**r, "version": 3}, "version 3"),
        (lambda r: {**r, "version": 1}, "version 1 written before the fit was constrained"),
        (lambda r: {**r, "version": True}, "version True"),
        (lambda r: {**r, "version": 2.0}, "version 2.0"),
        (lambda r: {**r, "kind": ["knee"]}, "kind \\['knee'\\]"),
        (lambda r: {**r, "coefficients": {**r["coefficients"], "b": -0.001}}, "a knee model needs b, c, d >= 0"),
        (lambda r: {**r, "coefficients": {**r["coefficients"], "a": -0.5}}, "a \\+ floor_s >= 0"),
        (lambda r: {**r, "model": None}, '"model" must name'),
        (lambda r: {**r, "coefficients": [1, 2]}, '"coefficients" must be an object'),
        (lambda r: {**r, "coefficients": {**r["coefficients"], "b": "fast"}}, "coefficients.b must be a finite number"),
        (lambda r: {**r, "coefficients": {**r["coefficients"], "d": float("nan")}}, "coefficients.d must be a finite"),
        (lambda r: {**r, "coefficients": {**r["coefficients"], "e": 1.0}}, "unknown coefficient\\(s\\) e"),
        (lambda r: {**r, "coefficients": {**r["coefficients"], "swap_bandwidth": 0}}, "swap_bandwidth must be >= 1000"),
        # found by probing: each priced steps at inf (an internal error, NaN shares) or crashed the reader
        (
            lambda r: {**r, "coefficients": {**r["coefficients"], "c": 1e308}},
            "c must be at most 1e\\+09 seconds a unit",
        ),
        (lambda r: {**r, "coefficients": {**r["coefficients"], "swap_bandwidth": 1e-300}}, "swap_bandwidth must be >="),
        (
            lambda r: json.dumps(r).replace('"c": 0.0025', '"c": 1' + "0" * 400),
            "coefficients.c must be a finite number",
        ),
        (lambda r: json.dumps(r).replace('"version": 2', '"version": 1' + "0" * 5000), "not a JSON this reader takes"),
    ],
)
def test_bad_file_is_one_line(tmp_path, edit, message):
    path = _write(tmp_path)
    record = json.loads(path.read_text())
    changed = edit(record)
    path.write_text(changed if isinstance(changed, str) else json.dumps(changed))
    with pytest.raises(ValueError, match=message) as info:
        read_cost_model(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_a_step_priced_past_the_time_limit_stops_the_run_in_one_line():
    """Coefficients within their bounds can still price a big step past MAX_TIME_S: refused where it is priced, by
    the stepping loop and by the fast-forward alike (it was an internal error, or a summary of inf and NaN)."""
    slow = CalibratedCostModel(a=0.0, b=0.0, c=6e8, d=0.0)  # 600 million seconds a decoding sequence
    for jump in (True, False):
        with pytest.raises(
            ValueError, match=r"the cost model priced a step .* at 1\.2e\+09 s \(allowed: at most 1e\+09"
        ):
            run(
                num_requests=2,
                arrival="offline",
                workload="fixed",
                prompt_len=8,
                output_len=4,
                kv_slots=4096,
                cost_model=slow,
                jump=jump,
            )


def test_a_piecewise_file_without_its_kind_says_it_was_read_as_a_knee_model(tmp_path):
    path = tmp_path / "cost.json"
    record = cost_model_record(PIECES, "smollm2-135m")
    del record["kind"]
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match='no "kind": read as a knee model\\): coefficients.a must be a finite number'):
        read_cost_model(path)


def test_a_cost_file_with_an_8_bit_kv_cache_is_refused(tmp_path):
    with pytest.raises(ValueError, match="kv_dtype 'int8' needs the roofline"):
        run(num_requests=2, model="smollm2-135m", kv_slots=4096, kv_dtype="int8", cost_model=str(_write(tmp_path)))


def test_missing_file_and_other_model_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no such file .*python -m reference calibrate"):
        read_cost_model(tmp_path / "absent.json")
    with pytest.raises(ValueError, match="measured on smollm2-135m, not opt-13b"):
        cost_model_for(_write(tmp_path), "opt-13b")


def test_run_prices_steps_with_the_file(tmp_path):
    path = _write(tmp_path)
    args = dict(
        model="smollm2-135m",
        workload="uniform",
        num_requests=20,
        rate=4.0,
        prompt_len_range=(8, 200),
        output_len_range=(8, 60),
        kv_slots=4096,
        seed=3,
    )
    from_file, from_object = run(**args, cost_model=str(path)), run(**args, cost_model=TRUTH)
    assert from_file.summary["cost_model"] == str(path) and "cost_model" not in from_object.summary
    assert np.array_equal(from_file.steps.columns["duration"], from_object.steps.columns["duration"])
    steps = from_file.steps.columns
    # every step lasted what the model says of its shape (decode-only steps read their contexts: at least the floor)
    assert (steps["duration"] >= TRUTH.a + TRUTH.floor_s - 1e-12).all()
    with pytest.raises(ValueError, match="measured on smollm2-135m, not opt-13b"):
        run(**{**args, "model": "opt-13b"}, cost_model=str(path))


def test_cli_takes_a_cost_model_and_refuses_a_bad_one(tmp_path):
    path = _write(tmp_path)
    common = [
        "run",
        "--model",
        "smollm2-135m",
        "--workload",
        "fixed",
        "--prompt-len",
        "64",
        "--output-len",
        "16",
        "--num-requests",
        "4",
        "--kv-slots",
        "2048",
        "--json",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "sim", *common, "--cost-model", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["cost_model"] == str(path)
    (tmp_path / "bad.json").write_text("{")
    bad = subprocess.run(
        [sys.executable, "-m", "sim", *common, "--cost-model", str(tmp_path / "bad.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "not JSON" in bad.stderr


def test_deeply_nested_or_not_regular_file_is_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        read_cost_model(deep)
    with pytest.raises(ValueError, match="not a regular file"):
        read_cost_model(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):  # refused before opening: nothing blocks
        read_cost_model(fifo)


# A CPU-like truth: a line per token, a cost per decoding sequence, per K/V token read and per prompt attention pair.
PIECES = PiecewiseCostModel(
    knots=(1, 2, 4, 8, 64, 512, 4096),
    values=(0.040, 0.041, 0.043, 0.047, 0.12, 0.7, 5.4),
    c=3e-4,
    d=2.5e-6,
    e=5e-7,
    d_shared=1e-6,
)


def _pairs(*prompts: int) -> int:
    return sum(p * (p + 1) // 2 for p in prompts)


def _design() -> list[tuple]:
    """Shapes like calibrate's: decode batches at two contexts, prompts alone, several prompts at once."""
    shapes = [(0, s, s * c, 0, 0) for s in (1, 2, 3, 4, 6, 8, 16, 32, 64) for c in (20, 300)]
    shapes += [(p, 0, p, _pairs(p), 0) for p in (8, 32, 64, 128, 256, 512, 1024, 2048, 4096)]
    shapes += [(k * p, 0, k * p, _pairs(*[p] * k), 0) for k, p in ((2, 2048), (4, 1024), (8, 512), (2, 256))]
    shapes += [(0, s, s * 1040, 0, (s - 1) * 1024) for s in (4, 16, 48)]  # s sequences behind one cached prefix
    return shapes + [(48, 8, 400, _pairs(48), 0), (200, 16, 900, _pairs(200), 0)]


def test_piecewise_fit_recovers_a_known_model():
    rows = [(*shape, PIECES.step_time(*shape)) for shape in _design()]
    fitted = PiecewiseCostModel.fit(rows, robust=False, knot_ratio=1.01)
    # knots sit at measured token counts (here at every one, PIECES' among them), so the line between them is recovered
    assert set(PIECES.knots) <= set(fitted.knots) <= {p + s for p, s, *_ in rows}
    for n in (1, 3, 8, 50, 300, 1500, 4096):
        assert fitted.tokens_time(n) == pytest.approx(PIECES.tokens_time(n), rel=1e-6)
    assert (fitted.c, fitted.d, fitted.e, fitted.d_shared) == pytest.approx(
        (PIECES.c, PIECES.d, PIECES.e, PIECES.d_shared), rel=1e-6
    )
    # the calibrated range is what was measured
    assert fitted.knots[0] == 1 and fitted.knots[-1] == 4096 and fitted.max_decode_seqs == 64
    assert fitted.max_prefill_pairs == _pairs(4096) and fitted.max_context_tokens == max(r[2] for r in rows)
    # one prompt of 4,096 tokens costs more than four of 1,024: its attention is 4x larger
    assert fitted.step_time(4096, 0, 4096, _pairs(4096)) > fitted.step_time(4096, 0, 4096, _pairs(*[1024] * 4)) + 1
    # and a step with no shared read in the design measures no d_shared: None, every read at d
    assert PiecewiseCostModel.fit([r for r in rows if not r[4]]).d_shared is None


def test_piecewise_fit_is_monotone_where_the_machine_is_not():
    # a step of 2 tokens measured slower than one of 4 (a CPU's matrix kernels): the fit does not follow it down
    rows = [(*shape, PIECES.step_time(*shape) * (1.4 if shape[0] + shape[1] == 2 else 1.0)) for shape in _design()]
    fitted = PiecewiseCostModel.fit(rows)
    assert all(b >= a for a, b in zip(fitted.values, fitted.values[1:]))
    assert fitted.step_time(0, 4, 80) >= fitted.step_time(0, 2, 40)


def test_robust_fit_shrugs_off_a_slowed_step():
    rows = [(*shape, PIECES.step_time(*shape)) for shape in _design()]
    rows[5] = (*rows[5][:5], rows[5][5] * 10)  # one step slowed tenfold by something else on the machine
    robust, squares = PiecewiseCostModel.fit(rows), PiecewiseCostModel.fit(rows, robust=False)

    def error(model):
        return np.median([abs(model.step_time(*r[:5]) / PIECES.step_time(*r[:5]) - 1) for r in rows])

    assert error(robust) < 0.01 and error(robust) < error(squares)


# hypothesis: random designs, noisy and sparse, from truths that need not be monotone
_shape = st.tuples(
    st.integers(0, 4096), st.integers(0, 128), st.integers(0, 20_000), st.integers(0, 10_000_000), st.floats(0, 1)
)  # the last: the share of the context read from shared blocks


@machine_settings(max_examples=150)
@given(
    shapes=st.lists(_shape, min_size=4, max_size=60),
    noise=st.floats(0, 0.5),
    seed=st.integers(0, 2**16),
    knot_ratio=st.floats(1.01, 4.0),
)
def test_every_fit_is_non_negative_and_monotone(shapes, noise, seed, knot_ratio):
    shapes = [(*s[:4], int(s[2] * s[4])) for s in shapes if s[0] + s[1] > 0]
    assume(len({p + d for p, d, *_ in shapes}) >= 2 and len(shapes) >= 4)
    rng = np.random.default_rng(seed)
    # a truth that wobbles (not monotone) and noise that can halve or double a step
    rows = [
        (
            *s,
            max(
                1e-4,
                (
                    0.03
                    + 1e-3 * (s[0] + s[1]) * (1 + 0.5 * np.sin(s[0] + s[1]))
                    + 1e-4 * s[1]
                    + 1e-6 * s[2]
                    + 3e-7 * s[3]
                    - 5e-7 * s[4]
                )
                * np.exp(noise * rng.standard_normal()),
            ),
        )
        for s in shapes
    ]
    model = PiecewiseCostModel.fit(rows, knot_ratio=knot_ratio)
    assert model.values[0] >= 0 and all(b >= a for a, b in zip(model.values, model.values[1:]))
    assert model.c >= 0 and model.d >= 0 and model.e >= 0 and (model.d_shared is None or model.d_shared >= 0)
    assert set(model.knots) <= {float(p + d) for p, d, *_ in shapes}  # every knot a measured size
    # priced anywhere, in range or far outside it: positive, and more of any input never costs less
    for tokens in (0, 1, 5, 700, 9000, 100_000):
        base = model.step_time(tokens, 3, 5000, 10_000)
        floor = base * (1 - 1e-12)  # (a flat piece of g: equal up to rounding)
        assert base > 0
        assert model.step_time(tokens + 100, 3, 5000, 10_000) >= floor
        assert model.step_time(tokens, 4, 5000, 10_000) >= floor
        assert model.step_time(tokens, 3, 6000, 10_000) >= floor and model.step_time(tokens, 3, 5000, 20_000) >= floor
        assert model.step_time(tokens, 3, 5000, 10_000, 4000) > 0


@pytest.mark.parametrize(
    "values, message",
    [
        ((0.05, 0.04, 0.06), "values must not decrease .* 0.04 at 2 tokens"),
        ((0.04, 0.06, 1e300), "the last value must be at most 1e\\+09 seconds a unit, got 1e\\+300"),
        ((-0.01, 0.04, 0.06), "values must be >= 0 seconds"),
        ((0.04, 0.06, -18.9), "values must not decrease"),
    ],
)
def test_an_absurd_model_is_refused(values, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        PiecewiseCostModel(knots=(1, 2, 4), values=values, c=0.0, d=0.0)
    # and from a file, as one line naming it
    path = tmp_path / "absurd.json"
    record = cost_model_record(PIECES, "smollm2-135m")
    record["coefficients"].update(knots=[1, 2, 4], values=list(values))
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=f"cost model {path}: {message}"):
        read_cost_model(path)


def test_a_slope_past_the_bound_is_refused():
    """Knots 1e-300 tokens apart: g's slope is 1e299 seconds a token, a 2-token step would cost 2e299 s."""
    with pytest.raises(ValueError, match="g's slope from 0 to 1e-300 tokens must be at most 1e\\+09 seconds a unit"):
        PiecewiseCostModel(knots=(0.0, 1e-300), values=(0.1, 0.2), c=0.0, d=0.0)


def test_piecewise_model_round_trips_and_checks_its_lists(tmp_path):
    path = tmp_path / "pieces.json"
    fitted = PiecewiseCostModel.fit([(*shape, PIECES.step_time(*shape)) for shape in _design()])
    for model in (fitted, PIECES):  # a fitted model has a range, a hand-made one none (null)
        write_cost_model(path, cost_model_record(model, "smollm2-135m"))
        assert read_cost_model(path)[0] == model and json.loads(path.read_text())["kind"] == "piecewise"
    record = json.loads(path.read_text())
    for bad, message in (
        ({"knots": [1, 1, 2, 3, 4, 5, 6]}, "strictly increasing"),
        ({"values": [1, 2]}, "one value per"),
        ({"knots": "1,2"}, "coefficients.knots must be a list"),
        ({"c": -1.0}, "c, d, d_shared and e must be >= 0"),
        ({"e": -1e-9}, "c, d, d_shared and e must be >= 0"),
        ({"d_shared": -1e-9}, "c, d, d_shared and e must be >= 0"),
        ({"max_context_tokens": -1}, "max_context_tokens must be >= 0"),
        ({"max_prefill_pairs": "all"}, "coefficients.max_prefill_pairs must be a finite number"),
    ):
        path.write_text(json.dumps({**record, "coefficients": {**record["coefficients"], **bad}}))
        with pytest.raises(ValueError, match=message):
            read_cost_model(path)
    path.write_text(json.dumps({**record, "kind": "neural"}))
    with pytest.raises(ValueError, match="kind 'neural' \\(allowed: knee, piecewise\\)"):
        read_cost_model(path)


NARROW = PiecewiseCostModel(
    knots=(1, 8, 64, 256),
    values=(0.04, 0.05, 0.12, 0.4),
    c=3e-4,
    d=2.5e-6,
    e=5e-7,
    max_decode_seqs=8,
    max_context_tokens=4000,
    max_prefill_pairs=_pairs(256),
)


def test_a_run_counts_the_steps_priced_outside_the_calibrated_range():
    args = dict(
        model="smollm2-135m",
        workload="uniform",
        num_requests=30,
        rate=4.0,
        output_len_range=(8, 60),
        kv_slots=8192,
        seed=3,
    )
    inside = run(**args, prompt_len_range=(8, 120), max_num_seqs=8, cost_model=NARROW).summary
    assert inside["extrapolated_steps"] == 0 and inside["extrapolated_time_share"] == 0.0
    outside = run(**args, prompt_len_range=(8, 600), cost_model=NARROW).summary
    assert 0 < outside["extrapolated_steps"] <= outside["num_steps"]
    assert 0 < outside["extrapolated_time_share"] <= 1 and "64" not in outside["calibrated_range"][:3]
    # stepping token by token counts the same steps as the fast-forward does
    stepped = run(**args, prompt_len_range=(8, 600), cost_model=NARROW, jump=False).summary
    assert stepped["extrapolated_steps"] == outside["extrapolated_steps"]
    assert stepped["extrapolated_time_share"] == pytest.approx(outside["extrapolated_time_share"], rel=1e-9)
    # the roofline (no calibrated range) reports nothing of the kind
    assert "extrapolated_steps" not in run(**args, prompt_len_range=(8, 600)).summary


def test_the_cli_notes_extrapolation_in_one_line(tmp_path):
    path = tmp_path / "narrow.json"
    write_cost_model(path, cost_model_record(NARROW, "smollm2-135m"))
    common = [
        sys.executable,
        "-m",
        "sim",
        "run",
        "--model",
        "smollm2-135m",
        "--workload",
        "fixed",
        "--output-len",
        "16",
        "--num-requests",
        "4",
        "--kv-slots",
        "4096",
        "--json",
        "--cost-model",
        str(path),
    ]
    inside = subprocess.run([*common, "--prompt-len", "64"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert inside.returncode == 0 and "note:" not in inside.stderr, inside.stderr
    out = subprocess.run([*common, "--prompt-len", "900"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    notes = [line for line in out.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and f"{summary['extrapolated_steps']} of {summary['num_steps']} steps" in notes[0]
    assert "outside the cost model's calibrated range (1 to 256 tokens a step" in notes[0]


def test_a_cost_object_of_the_old_three_number_shape_is_refused_at_entry():
    class ThreeNumbers:
        def step_time(self, num_prefill_tokens, num_decode_seqs, num_context_tokens):
            return 0.01

        def swap_time(self, num_bytes, num_blocks=0):
            return 0.0

    with pytest.raises(ValueError, match="ThreeNumbers.step_time must take 5 positional numbers"):
        run(
            model="smollm2-135m",
            workload="fixed",
            prompt_len=8,
            output_len=4,
            num_requests=2,
            kv_slots=1024,
            cost_model=ThreeNumbers(),
        )
    with pytest.raises(ValueError, match="object.step_time must take 5"):
        run(
            model="smollm2-135m",
            workload="fixed",
            prompt_len=8,
            output_len=4,
            num_requests=2,
            kv_slots=1024,
            cost_model=object(),
        )


def test_shared_reads_are_priced_apart_and_the_fast_forward_still_equals_stepping():
    # n = 3 samples of one prompt read its blocks three times a step: a model that prices a shared read apart
    shared = PiecewiseCostModel(
        knots=(1, 8, 64, 512), values=(0.04, 0.05, 0.12, 0.7), c=3e-4, d=6e-6, e=5e-7, d_shared=2e-6
    )
    args = dict(
        model="smollm2-135m",
        workload="uniform",
        num_requests=12,
        rate=2.0,
        prompt_len_range=(40, 300),
        output_len_range=(10, 60),
        kv_slots=8192,
        seed=4,
        n=3,
    )
    jumped, stepped = run(**args, cost_model=shared), run(**args, cost_model=shared, jump=False)
    assert np.array_equal(jumped.steps.columns["duration"], stepped.steps.columns["duration"])
    assert np.array_equal(jumped.requests.columns["e2e_latency"], stepped.requests.columns["e2e_latency"])
    # cheaper shared reads make the run faster than the same model pricing every read at d
    plain = run(**args, cost_model=PiecewiseCostModel(shared.knots, shared.values, shared.c, shared.d, shared.e))
    assert jumped.summary["sim_time_s"] < plain.summary["sim_time_s"]


def test_a_plan_counts_the_reads_of_blocks_another_entry_reads():
    from sim.scheduling.plan import ScheduledSeq, StepPlan
    from sim.scheduling.step_shape import shared_context_tokens

    # two samples sharing blocks 0 and 1 (a 20-token prompt, block size 16), each with its own third block
    plan = StepPlan(decodes=[ScheduledSeq(0, 0, 33, 1, [0, 1, 2]), ScheduledSeq(1, 0, 33, 1, [0, 1, 3])])
    assert plan.num_context_tokens == 68 and shared_context_tokens(plan, 16) == 32
    # a chunk after a cached prefix shared with a decode: the decode reads 5 tokens of block 4, the chunk all 16
    plan = StepPlan(prefills=[ScheduledSeq(2, 1, 16, 8, [4, 5])], decodes=[ScheduledSeq(3, 2, 4, 1, [4])])
    assert shared_context_tokens(plan, 16) == 5
    assert shared_context_tokens(StepPlan(decodes=[ScheduledSeq(0, 0, 33, 1, [0, 1, 2])]), 16) == 0


_HOSTILE_JSON = [
    "-1",
    "0",
    "1e400",
    "NaN",
    "Infinity",
    "true",
    "false",
    "null",
    '"x"',
    "[]",
    "{}",
    "[1, 0.5, -3]",
    "[" * 3000 + "]" * 3000,
    '{"a": 1}',
    "1.0",
    "2",
    "3",
    '"piecewise"',
    '"knee"',
    "[1, 1, 1]",
    '"\\ud800"',
    "1" + "0" * 500,
    "1" + "0" * 5000,
    "1e308",
    "1e-300",
    "5e-324",
]


@st.composite
def _mutated_cost_file(draw) -> bytes:
    """A valid version-2 file with 1-3 values replaced by hostile ones, keys dropped or bytes cut or flipped."""
    record = cost_model_record(
        PiecewiseCostModel.fit([(*s, PIECES.step_time(*s)) for s in _design()]), "smollm2-135m", fit={"in_sample": {}}
    )
    text = json.dumps(record)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["value"] * 5 + ["drop", "cut", "flip"]))
        spans = [m.span() for m in re.finditer(r'-?[0-9][0-9.eE+-]*|"[^"]*"(?!\s*:)|true|false|null', text)]
        if kind == "value" and spans:
            start, end = draw(st.sampled_from(spans))
            text = text[:start] + draw(st.sampled_from(_HOSTILE_JSON)) + text[end:]
        elif kind == "drop":
            keys = [m.group(1) for m in re.finditer(r'"([a-z_]+)":', text)]
            key = draw(st.sampled_from(keys)) if keys else None
            text = re.sub(rf'"{key}": ', '"dropped_' + (key or "") + '": ', text, count=1) if key else text
        elif kind == "cut":
            text = text[: draw(st.integers(0, len(text)))]
        elif text:
            i = draw(st.integers(0, len(text) - 1))
            text = text[:i] + chr((ord(text[i]) + draw(st.integers(1, 60))) % 128) + text[i + 1 :]
    return text.encode("utf-8", "surrogatepass")


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=_mutated_cost_file())
def test_a_mutated_cost_model_file_is_a_model_that_cannot_be_absurd_or_one_line(data):
    path = Path(tempfile.gettempdir()) / f"cost_fuzz_{os.getpid()}.json"  # one file, rewritten by every example
    path.write_bytes(data)
    try:
        model, _ = read_cost_model(path)
    except ValueError as e:
        message = str(e)
        assert message.startswith(f"cost model {path}") and "\n" not in message and len(message) < 2000, message
        return
    # accepted: then it prices every step at a positive time, and more work never at less
    for tokens in (0, 1, 100, 5000):
        base = model.step_time(tokens, 2, 1000, 500, 200)
        assert base > 0 and model.step_time(tokens + 10, 2, 1000, 500, 200) >= base * (1 - 1e-12)
    # and finite at the largest shapes and swaps within the simulator's limits (a bound on every coefficient)
    assert math.isfinite(model.step_time(10**7, 10**6, 10**10, 10**14, 10**9)) and math.isfinite(
        model.swap_time(10**13)
    )
