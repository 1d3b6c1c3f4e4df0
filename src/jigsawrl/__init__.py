"""jigsawrl: run many LLM RL post-training pipelines on one shared accelerator pool.

Implements the JigsawRL system (arXiv 2604.23838): sub-stage graphs, pipeline multiplexing,
dynamic resource allocation, long-tail migration and a look-ahead scheduler, with a simulated
executor (this package's core, no torch / ray needed) and a real runtime (``engine/``).
See ``DESIGN.md`` in the shared folder and the README for the map.
"""

__version__ = "0.1.0"
