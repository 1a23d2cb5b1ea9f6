"""Maintain: every view brought up to date over the tables' deltas, incrementally or by recomputing,
chosen per view and batch by the cost model (maintenance.py).

A batch's deltas enter through ``Engine.maintain_and_publish`` (ivm/engine.py).
"""
