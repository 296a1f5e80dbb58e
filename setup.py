"""Build hook for the allocator's Cython extension; everything else lives in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension("dra_driver.allocator._scan", ["dra_driver/allocator/_scan.pyx"]),
]

# The generated C goes under build/ (ignored), not next to the source.
setup(
    ext_modules=cythonize(
        extensions,
        build_dir="build/cython",
        language_level=3,
        compiler_directives={"binding": False},
    )
)
