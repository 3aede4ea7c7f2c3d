"""Randomized fault schedules (Jepsen-style): real processes, real faults, one invariant."""
