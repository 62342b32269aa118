"""Build the Cython extensions of dtok_ext (everything else is in pyproject.toml)."""
from Cython.Build import cythonize
from setuptools import Extension, setup

MODULES = ["specials", "cuts", "align", "buffers", "heap", "shm", "outline", "utf8", "cpus"]

extensions = [
    Extension(f"dtok_ext.{name}", [f"dtok_ext/{name}.pyx"], extra_compile_args=["-O3"])
    for name in MODULES
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    )
)
