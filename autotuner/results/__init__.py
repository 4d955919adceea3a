"""What a study measured, written and read back: a trial recorded (`store`), the stored trials as
records and their ranking (`records`), the configs tried and ruled out (`tried`), the fp32
reference and the re-measurements (`evidence`), the profiles (`profiles`), and each config's
predicted run time and cost (`run_time`).
"""
