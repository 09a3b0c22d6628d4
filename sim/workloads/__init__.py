"""Requests: generated, read from a trace, imported from ShareGPT; a run's workload step.

workload.py (synthetic lengths and arrivals), conversation.py (multi-turn chat sessions), trace.py (request
traces, JSONL and CSV), sharegpt.py and conversation_import.py (ShareGPT files), workload_source.py (which of
them a run's requests come from: `sim.run`'s workload step). Above sim.base, below everything else.
"""
