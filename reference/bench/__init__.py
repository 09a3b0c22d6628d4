"""The engine's benchmarks and load generator: bench.py (`python -m reference bench`, CPU and GPU), bench_gpu.py,
bench_hybrid.py, bench_offload.py, bench_speculative.py, loadtest.py (open-loop load against the server). The
kernels' own benchmark is reference/attention/bench.py.
"""
