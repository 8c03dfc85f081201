"""One module per family: its cases (OPS: op -> case(tokens, hidden, dtype, device), with SWEEPS
and CPU_SWEEPS) and, for the suites with their own shapes and columns (gemm, loss's fused
linear + cross-entropy, overhead, e2e), its run. Tables and plots: views/<family>.py."""
