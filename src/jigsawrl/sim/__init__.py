"""Simulation kernel: the event queue and the models of running work (rollout, compute stages)."""
