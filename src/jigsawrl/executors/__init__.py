"""Executors: the simulated one (event-driven, truth model) and, separately, the Ray one."""
