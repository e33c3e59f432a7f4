"""C sources of the replay kernels (``sumtree.c``), compiled on first use by :mod:`echorl_agent.replay.ckernel`.

A package of its own so that setuptools ships the sources as its package data (``echorl_agent.replay.kernels``
is then in ``packages``, and a build prints no "Package would be ignored" warning).
"""
