"""Backend adapters (installed as `localspec.backends`): llama.cpp and MLX behind one protocol."""
