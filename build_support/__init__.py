"""Build-time code generation, run by ``hatch_build.py`` (not part of the installed package).

Standard library only at import time: the wheel build loads these files by path, in a build
environment that holds only ``[build-system].requires``.
"""
