"""The command lines and the batch drivers: cli.py (`python -m sim ...`), sweep.py (sim.run over a grid),
bench_sim.py and bench_alloc.py (the simulator's and the allocators' benchmarks).
"""
