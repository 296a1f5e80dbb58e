"""Build hook for the Cython extensions; everything else lives in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension("dra_driver.allocator._fastquantity", ["dra_driver/allocator/_fastquantity.pyx"]),
    Extension(
        "dra_driver.allocator._fastkernel",
        ["dra_driver/allocator/_fastkernel.pyx"],
        extra_compile_args=["-O2"],
    ),
]

setup(ext_modules=cythonize(extensions, language_level=3, compiler_directives={"binding": False}))
