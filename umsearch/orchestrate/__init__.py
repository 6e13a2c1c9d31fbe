"""Work that drives several packages at once: calibration (runtime + simulator + profile) and tuning
(search + runtime + calibration). It sits below the CLI, which stays thin, and above everything it
drives; nothing below imports it.
"""
