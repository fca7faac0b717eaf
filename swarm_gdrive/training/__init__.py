"""GRPO training on a task (reasoning-gym's or a Hugging Face dataset): the loss (grpo), the policy trainer, the grpo
workload, the task interface and its providers, the reward, curriculum, checkpoints, model loading and Hub pushes.
Imports the protocol, storage and config; never observation."""
