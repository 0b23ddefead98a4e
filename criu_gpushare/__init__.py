"""criu-gpushare: checkpoint and restore of NVIDIA GPU processes that share GPU memory, through CRIU."""

__version__ = "0.1.0"
