"""Generative models: in-flight batching over a paged KV cache, inside one worker.

``interface`` is what a model implements; ``block_pool`` and ``scheduler`` are the pure
cores (no torch, no threads); ``sampler`` and ``engine`` run the model's steps;
``runner`` is the thin shell that a Python-backend model becomes when its config names
a generative class (docs/generative-models.md).
"""
