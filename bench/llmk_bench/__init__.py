"""llmk's benchmark harness (not part of the wheel): runner.py over the per-family suites in
suites/, their tables and plots in views/ (no torch), timing.py the protocol."""
