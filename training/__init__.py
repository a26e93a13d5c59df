"""GRPO and SFT training on TRL (installed as ``drgym.training``)."""
