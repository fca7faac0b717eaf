"""GRPO training on reasoning-gym tasks: the loss (grpo), the policy trainer, the grpo workload, tasks, rewards,
curriculum, checkpoints, model loading and Hub pushes. Imports the protocol, storage and config; never observation."""
