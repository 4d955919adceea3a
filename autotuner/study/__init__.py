"""The study in its RDB storage: opening it and tying it to one machine and job (`storage`,
`fingerprint`), the names of what it stores (`names`), the claims its workers agree through
(`claims`), and the one adapter to Optuna's private members (`optuna_adapter`).
"""
