"""loco.lab: turning finished runs into verdicts, and launching them."""
