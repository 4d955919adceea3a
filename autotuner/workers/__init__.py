"""Many search processes on one study: which of them runs what (`coordination`), who owns a
running trial and what becomes of it when its worker dies (`ownership`), one worker per GPU for
`--jobs` (`multi_gpu`), and workers that a cluster's scheduler starts (`cluster`).
"""
