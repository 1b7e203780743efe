"""The llama.cpp backend (GGUF files through llama-cpp-python): backend.py is its BackendModule; the rest are
what only this backend has (ext.py: symbols llama-cpp-python does not bind; batch.py: a head's context;
head.py: a head beside the target; eagle3/mtp/dflash.py: each head family's forward passes; multi.py: several
sequences in one context)."""
