"""The MLX backend (mlx-lm directories or Hub repos): backend.py is its BackendModule; the rest are what only
this backend has (capture.py: hidden states read by swapping layer classes; head.py: a head beside the target;
eagle3/mtp/dflash.py: each head family's forward passes; multi.py: several sequences in one batch)."""
