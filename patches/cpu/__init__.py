"""CPU platform support (active only without CUDA): torch kernels, platform gaps, pre-import stub."""
