"""Query datasets: the JSONL format and loaders for real benchmarks."""
