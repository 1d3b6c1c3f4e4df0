"""Band 3 — benchmarks of jigsawrl (``jigsawrl bench ...``): simulator speed, decision times,
the paper's matrix, real pipelines on Ray, TRL side by side. Results go to docs/BENCHMARKS.md."""
