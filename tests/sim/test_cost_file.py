"""The calibrated cost model: the knee fit recovers what it should, the JSON file round-trips, a bad file is one
line, and `sim.run` / `python -m sim run --cost-model` price steps with it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.api import run
from sim.cost import CalibratedCostModel, PiecewiseCostModel
from sim.cost_file import cost_model_for, cost_model_record, read_cost_model, write_cost_model

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
    rows = [(p, s, c, 0.05 + 0.003 * p + 0.002 * s - 1e-7 * c) for p in (0, 64) for s in (1, 4, 16, 64)
            for c in (100, 5000, 20000)]  # fmt: skip
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


@pytest.mark.parametrize("edit, message", [
    (lambda r: "not json", "not JSON"),
    (lambda r: {**r, "format": "other"}, "expected a JSON object with \"format\""),
    (lambda r: {**r, "version": 2}, "version 2"),
    (lambda r: {**r, "model": None}, "\"model\" must name"),
    (lambda r: {**r, "coefficients": [1, 2]}, "\"coefficients\" must be an object"),
    (lambda r: {**r, "coefficients": {**r["coefficients"], "b": "fast"}}, "coefficients.b must be a finite number"),
    (lambda r: {**r, "coefficients": {**r["coefficients"], "d": float("nan")}}, "coefficients.d must be a finite"),
    (lambda r: {**r, "coefficients": {**r["coefficients"], "e": 1.0}}, "unknown coefficient\\(s\\) e"),
    (lambda r: {**r, "coefficients": {**r["coefficients"], "swap_bandwidth": 0}}, "swap_bandwidth must be > 0"),
])  # fmt: skip
def test_bad_file_is_one_line(tmp_path, edit, message):
    path = _write(tmp_path)
    record = json.loads(path.read_text())
    changed = edit(record)
    path.write_text(changed if isinstance(changed, str) else json.dumps(changed))
    with pytest.raises(ValueError, match=message) as info:
        read_cost_model(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_missing_file_and_other_model_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no such file .*python -m reference calibrate"):
        read_cost_model(tmp_path / "absent.json")
    with pytest.raises(ValueError, match="measured on smollm2-135m, not opt-13b"):
        cost_model_for(_write(tmp_path), "opt-13b")


def test_run_prices_steps_with_the_file(tmp_path):
    path = _write(tmp_path)
    args = dict(model="smollm2-135m", workload="uniform", num_requests=20, rate=4.0, prompt_len_range=(8, 200),
                output_len_range=(8, 60), kv_slots=4096, seed=3)  # fmt: skip
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
    common = ["run", "--model", "smollm2-135m", "--workload", "fixed", "--prompt-len", "64", "--output-len", "16",
              "--num-requests", "4", "--kv-slots", "2048", "--json"]  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "sim", *common, "--cost-model", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["cost_model"] == str(path)
    (tmp_path / "bad.json").write_text("{")
    bad = subprocess.run([sys.executable, "-m", "sim", *common, "--cost-model", str(tmp_path / "bad.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "not JSON" in bad.stderr


PIECES = PiecewiseCostModel(knots=(1, 2, 4, 8, 64, 512), values=(0.040, 0.048, 0.034, 0.045, 0.17, 1.4), c=3e-4,
                            d=2.5e-6)  # fmt: skip


def test_piecewise_fit_recovers_a_non_monotonic_model():
    # a step of 2 tokens slower than one of 4: what the CPU's matrix kernels do, and what a knee cannot follow
    shapes = [(0, s, s * c) for s in (1, 2, 3, 4, 6, 8, 16, 32, 64) for c in (20, 300)]
    shapes += [(p, 0, p) for p in (8, 32, 128, 256, 512, 700)] + [(48, 8, 400), (200, 16, 900)]
    rows = [(p, s, c, PIECES.step_time(p, s, c)) for p, s, c in shapes]
    fitted = PiecewiseCostModel.fit(rows, knots=PIECES.knots)
    assert fitted.knots == PIECES.knots
    assert fitted.values == pytest.approx(PIECES.values, rel=1e-6) and fitted.c == pytest.approx(PIECES.c, rel=1e-6)
    assert fitted.d == pytest.approx(PIECES.d, rel=1e-6)
    assert fitted.step_time(0, 2, 40) > fitted.step_time(0, 4, 80)
    # past the last knot the last segment's line goes on
    assert fitted.tokens_time(1024) == pytest.approx(1.4 + (1.4 - 0.17) / (512 - 64) * 512)
    # a knot no step lies next to is dropped, not guessed
    assert 4096 not in PiecewiseCostModel.fit(rows, knots=(*PIECES.knots, 2048, 4096)).knots


def test_piecewise_model_round_trips_and_checks_its_lists(tmp_path):
    path = tmp_path / "pieces.json"
    write_cost_model(path, cost_model_record(PIECES, "smollm2-135m"))
    assert read_cost_model(path)[0] == PIECES and json.loads(path.read_text())["kind"] == "piecewise"
    record = json.loads(path.read_text())
    for bad, message in (({"knots": [1, 1, 2, 3, 4, 5]}, "strictly increasing"), ({"values": [1, 2]}, "one value per"),
                         ({"knots": "1,2"}, "coefficients.knots must be a list"), ({"c": -1.0}, "c and d must be >= 0")):
        path.write_text(json.dumps({**record, "coefficients": {**record["coefficients"], **bad}}))
        with pytest.raises(ValueError, match=message):
            read_cost_model(path)
    path.write_text(json.dumps({**record, "kind": "neural"}))
    with pytest.raises(ValueError, match="kind 'neural' \\(allowed: knee, piecewise\\)"):
        read_cost_model(path)
