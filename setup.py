from setuptools import Extension, find_packages, setup

# chm._robuf: the read-only buffer type that views into device DRAM are
# exported through (cffi can only make writable buffers; see chm/_robuf.c).
ROBUF = Extension(
    "chm._robuf",
    sources=["chm/_robuf.c"],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror"],
)

setup(
    # every chm.* package (new ones are picked up without a change here), and
    # the emulator/ directory installed under a name of its own: chm_emu
    packages=[*find_packages(include=["chm", "chm.*"]), "chm_emu"],
    package_dir={"chm_emu": "emulator"},
    cffi_modules=["chm/_build_ffi.py:ffibuilder"],
    ext_modules=[ROBUF],
)
