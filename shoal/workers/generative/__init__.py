"""Generative models: in-flight batching over a paged KV cache, inside one worker.

``interface`` is what a model implements; ``block_pool``, ``scheduler`` and ``text`` are
pure cores (no torch, no threads); ``sampler`` and ``engine`` run the model's steps
(the clock passed in); ``runner`` is the thin shell that a Python-backend model becomes
when its config names a generative class, with ``settings`` (its config parameters) and
``metrics``; ``tensor_parallel`` spreads one instance over several processes
(docs/generative-models.md).
"""
