"""Test models built from PyPI packages: all-MiniLM-L6-v2 converted to a bert GGUF
(and a random-head reranker), and the packaged Qwen2.5-Coder pieces assembled.

Test and benchmark code only; the server never imports it. The converter needs
the ``gguf`` package, a test dependency.
"""
