"""loco.run: one training run (or R of one shape), from config to workdir."""
