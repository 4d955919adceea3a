"""The study loop: spec -> probe -> study -> reference -> proposals -> trials -> record ->
re-measurement -> profile -> export (`loop`), one trial from its proposal to its record
(`dispatch`), the fp32 reference (`reference`), the re-measurement (`remeasure`) and the profile
of the winner and the baseline (`profiling`).
"""
