"""Token provenance and FLOP accounting for comparing cache policies (docs/eval.md §2.6, §5.6-5.7)."""
