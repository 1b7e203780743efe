"""localspec: local speculative decoding with llama.cpp and MLX."""

__version__ = "0.1.0"
