"""The study loop: spec -> probe -> study -> reference -> proposals -> trials -> record ->
re-measurement -> profile -> export (`loop`), one trial from its proposal to its record
(`dispatch`), the fp32 reference (`reference`), the re-measurement (`remeasure`, a batch's rounds
`batch_rounds`) and the profile of the winner and the baseline (`profiling`). `autotuner apply`'s
run (`apply_run`) measures its promise check's rounds as the re-measurement does: one rounds
function for both (`paired_rounds`).
"""
