"""Measuring a training step inside a trial process, framework-free: the timed windows and their
calibration (`timing`), the turns a process takes in a lockstep group (`turns`), telemetry of the
CPU and GPU around the windows (`telemetry`), other work's share of the machine (`contention`),
the rule that stops a losing trial (`pruning`), drift against the reference (`drift`), a
speedup's interval from paired rounds (`interval`), a
profiler's trace read (`traces`), and what the hardware is (`hardware`).

Imported by trial processes and by the search alike; imports neither a framework nor Optuna.
"""
