"""Watching training: per-domain signals, alarms with actions, reward-hacking probes, audits.

Invariant: importing this package imports no torch; `Monitor` (monitor.py)
is what the loop holds, and everything it measures goes to metrics.jsonl,
the trace store's events table and the optional loggers.
"""
