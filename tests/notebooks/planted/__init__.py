"""Planted-bug solutions: each exercise's solution with one rule broken, and what the grader must say about it.

Each module defines PLANTED: a list of (id, break_it, machines, expected) where `break_it(Solution)` returns a
subclass with the bug, `machines` names the state machines (by kind, sim/exercises/registry.py) that must run
beside the examples to catch it, and `expected` lists strings the grade's text must contain: the operation and
the broken rule.
"""
