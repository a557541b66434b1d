"""Small internal utilities shared by the whole distribution (validation, atomic files, JSONL,
text helpers, the sync/async driver). Not public API."""
