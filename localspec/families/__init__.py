"""Drafter families: one module each (what it is, where it runs, its checks, how to build it), listed in
one table (localspec.families.registry)."""
