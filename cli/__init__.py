"""The `roundgate` command line: one entry point over serve, simulate, tune, calibrate and bench."""
