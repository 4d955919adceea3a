"""Trial processes: what the engine asks of one (`request`), how it is started, timed out and
read (`launcher`, `_forkserver`, `messages`), how it ended (`outcomes`), several measured together
(`lockstep`), and what runs inside it for every backend (`core`: the trial, the probe, the
profile; `factory`: the user's workload factory; `progress`: its phase, for the console).

A trial process imports this package and its backend's runner, never Optuna or the study loop.
"""
