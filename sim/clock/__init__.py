"""The simulated clock: the event loop (loop.py), what a step costs (cost.py; cost_file.py: a model fitted to the
engine, on disk) and the tables and summary of a run (metrics.py).
"""
