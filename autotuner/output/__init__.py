"""What a study shows: the console while it runs and its final table (`console`), numbers as every
view formats them (`formatting`), the charts (`charts`), optuna-dashboard's note and charts
(`dashboard`) and the one-page report (`report`), all read from the storage.
"""
