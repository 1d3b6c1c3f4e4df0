"""The simulator, split by concept (as Vidur splits one):

- :mod:`.kernel` — the event queue, one ordering key ``(time_s, priority, seq)``;
- :mod:`.dispatch` — the workload: each step's true requests, and their dispatch to ranks;
- :mod:`.rollout` — one engine instance's continuous batching (shared with the graph builder);
- :mod:`.rollout_task` — the rollout-task runtime: a rollout's ranks on the clock (its records
  in :mod:`.rollout_state`; AReaL's first-B batches in :mod:`.rollout_first_b`);
- :mod:`.batching` — sample-level batches: finished GRPO groups, first-B queues;
- :mod:`.stream` — StreamRL's streaming of finished groups into training within a step;
- :mod:`.works` — compute works: post-rollout stages and train-state memory moves;
- :mod:`.contention` — memory-bandwidth contention between co-located work;
- :mod:`.cluster` — :class:`~.cluster.SimCluster`, one clock over all of them;
- :mod:`.listener` — what the simulator reports to its owner.

``executors/simulated.py`` adapts :class:`~.cluster.SimCluster` to the driver's executor protocol.
"""
