"""``shoal analyze``, a client tool: it drives a shoal server it starts (shoal serve, as a
child process) through the public API, as Triton's Model Analyzer drives tritonserver, and
imports none of the server's roles (tests/unit/test_layering.py)."""
