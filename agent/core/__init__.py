"""Pure agent logic: stdlib only, no I/O, clock, randomness, logging or generated proto imports."""
