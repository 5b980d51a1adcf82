"""`make bench` and `make bench-check`: what the receiver costs, beside a ceiling and
adnanh/webhook. Each part is a module named for what it measures; `python -m bench.run`
runs them all and writes bench/RESULTS.md (docs/performance.md says what each part is)."""
