"""The job: the spec file's keys (`keys`), the spec validated against its backend (`job`), and
what the job asks of trial processes: the launcher, the probe, a config's request (`requests`).
"""
