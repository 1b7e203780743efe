"""Backend-independent speculative decoding: sampling, verification rules, drafters, the engine."""
