"""temper: post-training language models into agents."""

__version__ = "0.1.0"
