"""A calibrated cost model on disk: what `python -m reference calibrate` writes and `python -m sim run --cost-model`
reads (JSON, one object).

    {"format": "paged-attention-lab cost model", "version": 2,
     "model": "smollm2-135m",                      # the sim.base.specs model it was measured on
     "kind": "piecewise",                          # sim.clock.cost.PiecewiseCostModel ("knee": CalibratedCostModel)
     "coefficients": {"knots": [...], "values": [...], "c": ..., "d": ..., "e": ..., "d_shared": ..., "swap_bandwidth": ...,
                      "max_decode_seqs": ..., "max_context_tokens": ..., "max_prefill_pairs": ...},
     "fit": {...}, "machine": {...}, "versions": {...}, "engine": {...}, "design": [...], "command": "..."}

Only `format`, `version`, `model`, `kind` and `coefficients` are read back; the rest says where the numbers come from
(machine, library versions, the engine's settings, the designed batch shapes, the fit's errors) for whoever reads
the file. Every problem with a file is one line naming the file and the field, and a model that could price a step
at a negative time, or more work at less, is refused (values that decrease or go below 0, negative coefficients).
Version 2 added the prompt-attention term `e`, the shared-read term `d_shared` and the calibrated range (`max_*`); a version-1 file is refused with
a line saying to calibrate again (its fit had no constraints: the one committed then priced 1,536 tokens at -18.9 s).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from sim.base.outfiles import AtomicFiles, write_text
from sim.clock.cost import CalibratedCostModel, PiecewiseCostModel

FORMAT, VERSION = "paged-attention-lab cost model", 2
COEFFICIENTS = {  # kind -> its coefficients, each a number or (knots, values) a list of numbers
    "knee": ("a", "b", "c", "d", "floor_s", "swap_bandwidth"),  # CalibratedCostModel
    "piecewise": ("knots", "values", "c", "d", "e", "d_shared", "swap_bandwidth", "max_decode_seqs",
                  "max_context_tokens", "max_prefill_pairs"),  # PiecewiseCostModel
}
_CLASSES = {"knee": CalibratedCostModel, "piecewise": PiecewiseCostModel}
_LISTS = ("knots", "values")
# null: no bound (a model made by hand); d_shared null: a shared read costs d
_OPTIONAL = ("d_shared", "max_decode_seqs", "max_context_tokens", "max_prefill_pairs")

CostModelFit = CalibratedCostModel | PiecewiseCostModel


def cost_model_record(model: CostModelFit, model_name: str, **about) -> dict:
    """The JSON object for `model`, measured on the sim.base.specs model `model_name`; `about` adds the provenance."""
    kind = next(k for k, cls in _CLASSES.items() if isinstance(model, cls))
    coefficients = {name: list(getattr(model, name)) if name in _LISTS else getattr(model, name)
                    for name in COEFFICIENTS[kind]}
    return {"format": FORMAT, "version": VERSION, "model": model_name, "kind": kind, "coefficients": coefficients,
            **about}


def write_cost_model(path: str | Path, record: dict, *, make_parents: bool = False, files: AtomicFiles | None = None) -> None:
    """The record as JSON, written atomically; with `files`, as part of that group (sim.base.outfiles.atomic_files)."""
    text = json.dumps(record, indent=2) + "\n"
    if files is None:
        write_text(path, text, encoding="utf-8", make_parents=make_parents)
    else:
        with files.open(path, "w", encoding="utf-8") as f:
            f.write(text)


def _show(value, quote: bool = True) -> str:
    """A value for a one-line message: its repr (or the string itself), cut to 60 characters (a file may hold a
    megabyte in one key)."""
    text = repr(value) if quote else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value) -> bool:
    """A finite JSON number that a float holds (an integer of 400 digits is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def read_cost_model(path: str | Path) -> tuple[CostModelFit, dict]:
    """The cost model in `path` and the whole record; ValueError (one line) for anything else."""
    path = Path(path)
    if path.exists() and not path.is_file():  # a folder, a FIFO or a device would fail, block or never end
        raise ValueError(f"cost model {path}: not a regular file (give the JSON file `python -m reference calibrate` wrote)")
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
    except ValueError as e:  # an integer past Python's 4,300 digits
        raise ValueError(f"cost model {path}: not a JSON this reader takes ({e})") from None
    except RecursionError:
        raise ValueError(f"cost model {path}: JSON nested too deeply to be a cost model") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"cost model {path}: expected a JSON object with \"format\": \"{FORMAT}\" "
                         f"(as `python -m reference calibrate` writes)")
    version = record.get("version")
    if version != VERSION or isinstance(version, bool) or not isinstance(version, int):
        again = " written before the fit was constrained: run `python -m reference calibrate` again" if version == 1 else ""
        raise ValueError(f"cost model {path}: version {_show(version)}{again} (this code reads version {VERSION})")
    if not isinstance(record.get("model"), str):
        raise ValueError(f"cost model {path}: \"model\" must name the model it was measured on, got {_show(record.get('model'))}")
    kind = record.get("kind", "knee")
    if not isinstance(kind, str) or kind not in COEFFICIENTS:
        raise ValueError(f"cost model {path}: kind {_show(kind)} (allowed: {', '.join(COEFFICIENTS)})")
    if "kind" not in record:  # (files written before the piecewise model name no kind: they are knee models)
        path = f"{path} (no \"kind\": read as a knee model)"
    names = COEFFICIENTS[kind]
    coefficients = record.get("coefficients")
    if not isinstance(coefficients, dict):
        raise ValueError(f"cost model {path}: \"coefficients\" must be an object with {', '.join(names)}")
    values = {}
    for name in names:
        value = coefficients.get(name)
        if name in _OPTIONAL and value is None:
            values[name] = None
        elif name in _LISTS:
            if not isinstance(value, list) or not value or not all(_number(v) for v in value):
                raise ValueError(f"cost model {path}: coefficients.{name} must be a list of finite numbers, got {_show(value)}")
            values[name] = tuple(float(v) for v in value)
        elif not _number(value):
            raise ValueError(f"cost model {path}: coefficients.{name} must be a finite number, got {_show(value)}")
        else:
            values[name] = float(value)
    if kind == "knee" and not (values["b"] >= 0 and values["c"] >= 0 and values["d"] >= 0
                               and values["a"] + values["floor_s"] >= 0):
        raise ValueError(f"cost model {path}: a knee model needs b, c, d >= 0 and a + floor_s >= 0 (else a step can "
                         f"take negative time or more work less), got a={values['a']}, b={values['b']}, "
                         f"c={values['c']}, d={values['d']}, floor_s={values['floor_s']}")
    unknown = sorted(set(coefficients) - set(names))
    if unknown:
        raise ValueError(f"cost model {path}: unknown coefficient(s) {', '.join(_show(u, quote=False) for u in unknown)} (allowed: {', '.join(names)})")
    try:
        return _CLASSES[kind](**values), record
    except ValueError as e:
        raise ValueError(f"cost model {path}: {e}") from None


def cost_model_for(path: str | Path, model_name: str, num_gpus: int = 1, kv_dtype: str = "auto") -> CostModelFit:
    """The cost model in `path`, which must have been measured on `model_name` (a step time means nothing for
    another model's weights) and is used for one GPU.

    NOTE: num_gpus > 1 is refused, not priced: the fit measured one engine process on one device, so its step times
    hold neither tensor parallelism's division of the work nor its all-reduces (sim.clock.cost.RooflineCostModel adds
    those); reusing them would enlarge the KV pool n times at one device's speed."""
    cost, record = read_cost_model(path)
    if record["model"] != model_name:
        raise ValueError(f"cost model {path} was measured on {record['model']}, not {model_name} "
                         f"(run with --model {record['model']}, or calibrate for {model_name})")
    if num_gpus != 1:
        raise ValueError(f"cost model {path} was measured on one device and has no tensor-parallel terms: num_gpus "
                         f"{num_gpus} needs the roofline (drop the cost model file, or run with num_gpus 1)")
    if kv_dtype != "auto":  # NOTE: calibrate measures the engine's own K/V (the model's dtype): no 8-bit reads in it
        raise ValueError(f"cost model {path} priced K/V reads of the model's own dtype: kv_dtype {kv_dtype!r} needs "
                         f"the roofline (drop the cost model file, or kv_dtype 'auto')")
    return cost
