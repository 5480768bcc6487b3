"""Chaos service: seeded, replayable timelines of jobs, GPU faults and implants against a live cluster."""
