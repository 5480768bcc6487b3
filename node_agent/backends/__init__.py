"""GPU backends behind one interface (see ``base``): ``fake`` (seeded, persisted) and ``nvml``.

Input: a backend name. Output: nothing at import time; backends are imported lazily by
``node_agent.backends.base.load_backend_class`` so the nvml module (and pynvml) is only
loaded when asked for.
"""
