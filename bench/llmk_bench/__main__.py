"""python -m llmk_bench: the benchmark runner (runner.py says what it does)."""

import sys

from .runner import main

sys.exit(main())
