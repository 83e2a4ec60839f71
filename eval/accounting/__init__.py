"""Token provenance and FLOP accounting for comparing cache policies (eval_spec.md §2.6, §5.6-5.7)."""
