from setuptools import Extension, setup

# chm._robuf: the read-only buffer type that views into device DRAM are
# exported through (cffi can only make writable buffers; see chm/_robuf.c).
ROBUF = Extension(
    "chm._robuf",
    sources=["chm/_robuf.c"],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror"],
)

setup(cffi_modules=["chm/_build_ffi.py:ffibuilder"], ext_modules=[ROBUF])
