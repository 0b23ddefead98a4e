"""The fake CUDA driver used by the tests: build.py builds it, usage.py reads its memory usage files."""
