"""Data: the JSONL dataset schema, its loader, the synthetic generator and the splits."""
