"""How far to trust a profile's predictions: the held-out error its calibration measured.

A calibration (``umsearch calibrate``, ``profile --calibrate``, ``umsearch
tune``) predicts every measured plan from a fit of the *other* plans and keeps
the mean error as ``runtime.calibration.held_out_mape_percent``; that figure,
not the in-sample one, is what a user should expect of a new plan.
"""

from __future__ import annotations

from typing import Any

from umsearch.core.profile import Profile


def held_out_error(profile: Profile) -> float | None:
    """The profile's held-out (leave one plan out) MAPE in percent, None when it was never measured."""
    record: dict[str, Any] = profile.runtime.calibration or {}
    value = record.get("held_out_mape_percent")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def trust_line(profile: Profile, name: str = "the profile") -> str:
    """One line saying how far the profile's predictions held on plans left out of its fit."""
    record: dict[str, Any] = profile.runtime.calibration or {}
    value = held_out_error(profile)
    if value is None:
        if not record:
            return (f"{name} is not calibrated: its predictions leave out the runtime's own costs; "
                    "run `umsearch calibrate PROFILE` to fit them and measure the error on held-out plans")  # fmt: skip
        return (f"{name}'s calibration measured no held-out error (an older calibration, or one plan only); "
                "rerun `umsearch calibrate PROFILE` to measure it")  # fmt: skip
    plans = record.get("held_out") or []
    worst = max((abs(float(r["error"])) for r in plans if isinstance(r, dict) and "error" in r), default=None)
    worst_text = f", worst {worst:.1%}" if worst is not None else ""
    return (f"{name}'s predictions were off by {value:.1f}% on average on {len(plans)} plan(s) left out of its "
            f"calibration{worst_text}: expect about that error on a new plan")  # fmt: skip
