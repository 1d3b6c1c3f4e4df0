"""The single-controller loop: ask the policy, apply its decision, advance the executor."""
