"""loco.files: a run folder's files: reading and writing them."""
