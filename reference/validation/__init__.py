"""The engine checked against the simulator and against itself: calibrate.py (the cost model fitted to the engine),
validate_sim.py and validate_online.py (the simulator's predictions against the engine's runs), validation_suite.py,
kv_accuracy.py (8-bit KV against the full-precision cache), fault_injection.py (a fault at every KV call) and
readme_numbers.py (the README's numbers of `make calibrate`).
"""
