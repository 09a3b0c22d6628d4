"""A calibrated cost model on disk: what `python -m reference calibrate` writes and `python -m sim run --cost-model`
reads (JSON, one object).

    {"format": "paged-attention-lab cost model", "version": 1,
     "model": "smollm2-135m",                      # the sim.specs model it was measured on
     "kind": "piecewise",                          # sim.cost.PiecewiseCostModel ("knee": CalibratedCostModel)
     "coefficients": {"knots": [...], "values": [...], "c": ..., "d": ..., "swap_bandwidth": ...},
     "fit": {...}, "machine": {...}, "versions": {...}, "engine": {...}, "design": [...], "command": "..."}

Only `format`, `version`, `model`, `kind` and `coefficients` are read back; the rest says where the numbers come from
(machine, library versions, the engine's settings, the designed batch shapes, the fit's errors) for whoever reads
the file. Every problem with a file is one line naming the file and the field.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from sim.cost import CalibratedCostModel, PiecewiseCostModel
from sim.outfiles import write_text

FORMAT, VERSION = "paged-attention-lab cost model", 1
COEFFICIENTS = {  # kind -> its coefficients, each a number or (knots, values) a list of numbers
    "knee": ("a", "b", "c", "d", "floor_s", "swap_bandwidth"),  # CalibratedCostModel
    "piecewise": ("knots", "values", "c", "d", "swap_bandwidth"),  # PiecewiseCostModel
}
_CLASSES = {"knee": CalibratedCostModel, "piecewise": PiecewiseCostModel}
_LISTS = ("knots", "values")

CostModelFit = CalibratedCostModel | PiecewiseCostModel


def cost_model_record(model: CostModelFit, model_name: str, **about) -> dict:
    """The JSON object for `model`, measured on the sim.specs model `model_name`; `about` adds the provenance."""
    kind = next(k for k, cls in _CLASSES.items() if isinstance(model, cls))
    coefficients = {name: list(getattr(model, name)) if name in _LISTS else getattr(model, name)
                    for name in COEFFICIENTS[kind]}  # fmt: skip
    return {"format": FORMAT, "version": VERSION, "model": model_name, "kind": kind, "coefficients": coefficients,
            **about}  # fmt: skip


def write_cost_model(path: str | Path, record: dict, *, make_parents: bool = False) -> None:
    write_text(path, json.dumps(record, indent=2) + "\n", encoding="utf-8", make_parents=make_parents)


def _number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def read_cost_model(path: str | Path) -> tuple[CostModelFit, dict]:
    """The cost model in `path` and the whole record; ValueError (one line) for anything else."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"cost model {path}: no such file (write one with `python -m reference calibrate`)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cost model {path}: cannot read it ({type(e).__name__}: {e})") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"cost model {path}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"cost model {path}: expected a JSON object with \"format\": \"{FORMAT}\" "
                         f"(as `python -m reference calibrate` writes)")  # fmt: skip
    if record.get("version") != VERSION:
        raise ValueError(f"cost model {path}: version {record.get('version')!r} (this code reads version {VERSION})")
    if not isinstance(record.get("model"), str):
        raise ValueError(f"cost model {path}: \"model\" must name the model it was measured on, got {record.get('model')!r}")
    kind = record.get("kind", "knee")
    if kind not in COEFFICIENTS:
        raise ValueError(f"cost model {path}: kind {kind!r} (allowed: {', '.join(COEFFICIENTS)})")
    names = COEFFICIENTS[kind]
    coefficients = record.get("coefficients")
    if not isinstance(coefficients, dict):
        raise ValueError(f"cost model {path}: \"coefficients\" must be an object with {', '.join(names)}")
    values = {}
    for name in names:
        value = coefficients.get(name)
        if name in _LISTS:
            if not isinstance(value, list) or not value or not all(_number(v) for v in value):
                raise ValueError(f"cost model {path}: coefficients.{name} must be a list of finite numbers, got {value!r}")
            values[name] = tuple(float(v) for v in value)
        elif not _number(value):
            raise ValueError(f"cost model {path}: coefficients.{name} must be a finite number, got {value!r}")
        else:
            values[name] = float(value)
    unknown = sorted(set(coefficients) - set(names))
    if unknown:
        raise ValueError(f"cost model {path}: unknown coefficient(s) {', '.join(unknown)} (allowed: {', '.join(names)})")
    try:
        return _CLASSES[kind](**values), record
    except ValueError as e:
        raise ValueError(f"cost model {path}: {e}") from None


def cost_model_for(path: str | Path, model_name: str) -> CostModelFit:
    """The cost model in `path`, which must have been measured on `model_name` (a step time means nothing for
    another model's weights)."""
    cost, record = read_cost_model(path)
    if record["model"] != model_name:
        raise ValueError(f"cost model {path} was measured on {record['model']}, not {model_name} "
                         f"(run with --model {record['model']}, or calibrate for {model_name})")  # fmt: skip
    return cost
