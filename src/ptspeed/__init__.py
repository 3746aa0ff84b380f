"""ptspeed: reproducible PyTorch speed benchmarks across versions and optimisations."""

__version__ = "0.1.0"
