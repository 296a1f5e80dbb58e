"""Build hook for the Cython extensions; everything else lives in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension("dra_driver.allocator._fastquantity", ["dra_driver/allocator/_fastquantity.pyx"]),
    Extension(
        "dra_driver.allocator._fastkernel",
        ["dra_driver/allocator/_fastkernel.pyx"],
        extra_compile_args=["-O2"],
        # shareIDs: SHA-256 from the libcrypto Python's own hashlib links (the low-level calls,
        # deprecated in OpenSSL 3 but without the EVP layer's per-call setup)
        define_macros=[("OPENSSL_SUPPRESS_DEPRECATED", None)],
        libraries=["crypto"],
    ),
]

setup(ext_modules=cythonize(extensions, language_level=3, compiler_directives={"binding": False}))
