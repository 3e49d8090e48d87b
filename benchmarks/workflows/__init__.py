"""Workflow benchmarks: durable steps, parking, fan-out and crashes, side by side
with DBOS Transact on one PostgreSQL server.

``python -m benchmarks.workflows run [--quick] ...`` (see ``__main__.py``).
"""
