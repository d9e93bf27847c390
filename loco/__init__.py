"""loco: communication-efficient LLM pre-training with simulated workers."""
