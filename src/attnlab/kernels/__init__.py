"""CuTe DSL kernels, one module per kernel family and architecture (``sm80/forward.py``, ...).

Kernels import only the CuTe DSL and ``attnlab.config``; they never import the torch-level API.
"""
