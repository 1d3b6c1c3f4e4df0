"""The real CPU engine: small causal LMs, a character tokenizer, a continuous-batching rollout
engine with abort/resume, and the GRPO trainer that feeds it. Imports torch; the simulator and
schedulers never import this package."""
