"""Paged attention behind one interface: ``prepare(batch)`` once a forward, ``forward`` a layer.

Backends (``registry.py``): ``torch`` (reference, any device), ``triton`` (paged GQA decode
and extend, and absorbed MLA kernels: compiled on CUDA, interpreted on CPU under
``TRITON_INTERPRET=1``) and ``flashinfer`` (CUDA, optional extra). GPU packages are imported
only when their backend is built, so this package imports on a CPU-only machine.

This file holds no code: ``registry`` is read where torch must not load (``ServerArgs`` lists
the backends in every process, the ingress included), and Python runs this file first. Import
each name from the module that defines it (``base``, ``batch``, ``registry``, ...).
"""
