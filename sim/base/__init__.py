"""The bottom row: limits, specs and records any layer of the simulator may use.

limits.py (the stated limits and their checks), specs.py (model and GPU specs), request.py (`Request`),
outfiles.py (atomic output files), trace_files.py (reading a trace file safely), tokenizer.py (the lab's
offline tokenizer). This package imports nothing of its own: importing one module loads only that module.
"""
