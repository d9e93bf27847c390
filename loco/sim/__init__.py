"""loco.sim: the simulated network and clock."""
