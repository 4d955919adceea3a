"""What to run next: the sampler that never proposes a config the study has or an out-of-memory
trial rules out (`sampler`), its guided start (`guided_start`), and the Optuna sampler it wraps
with the study as that sampler sees it (`wrapped_sampler`).
"""
