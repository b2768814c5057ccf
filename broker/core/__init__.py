"""The pure core: planning, policies, spot models, throughput, money and the job status machine.

Plain dataclasses and numpy arrays in, decisions out: no I/O, no settings, no clock reads, no
database. The live broker (``broker.services``) and the trace simulator (``broker.sim``) call
the same functions.
"""
