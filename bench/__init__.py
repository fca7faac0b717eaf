"""Benchmarks of swarm_gdrive: coordination, generation, the training round, learning. Run ``python -m bench``."""
