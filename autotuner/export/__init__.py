"""The exported best config: written from the storage (`writer`), read back and checked against a
job and a machine (`reader`; `autotuner.apply` is its public face), and `autotuner apply`, which
runs the job with it and checks the promise it made (`promise`).
"""
