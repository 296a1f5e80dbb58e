"""Build hook for the Cython extensions; everything else lives in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension("dra_driver.allocator._fastquantity", ["dra_driver/allocator/_fastquantity.pyx"]),
]

setup(ext_modules=cythonize(extensions, language_level=3, compiler_directives={"binding": False}))
