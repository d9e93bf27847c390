"""loco.core: the contract and the engine."""
