"""Trace-driven simulation: the policies of ``broker.core`` on recorded spot availability.

The simulator, the hindsight optimum it is measured against, and what the simulated broker
knows before each start (its history and plans).
"""
