"""Benchmarks: one module per figure, each with `main(argv) -> int` printing one JSON object."""
