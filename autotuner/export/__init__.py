"""The exported best config, as a file: its one model (`file`), written from the storage (`writer`),
read back and checked against a job and a machine (`reader`; `autotuner.apply` is its public
face). Running the job with it and checking its promise is `autotuner.search.apply_run`.
"""
