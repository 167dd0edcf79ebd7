from setuptools import setup

setup(cffi_modules=["chm/_build_ffi.py:ffibuilder"])
