"""Band 3 — experiments: the wiring from a config to a driver, an executor and a summary.

One core (:mod:`jigsawrl.experiments.core`) builds the policy, the belief cost model and the
driver for every kind of run: simulated (:mod:`~jigsawrl.experiments.simulated`), real on Ray
(:mod:`~jigsawrl.experiments.real`), the prediction of a real run (:mod:`~jigsawrl.experiments.calibrate`);
real pipelines one after another live in :mod:`~jigsawrl.experiments.sequential`.
"""
