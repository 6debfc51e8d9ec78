"""Horizon core: requests, the KV block pool, the scheduler, policies, metrics and workloads.

Pure Python (numpy at most): importing it pulls no torch, simpy, hydra or scikit-learn.
"""
