"""Build the optional native listing core ``manyfiles._dents``.

Like benhoyt/scandir and python-xxhash: one C file, optional unless
MANYFILES_REQUIRE_C_EXTENSION is set (CI sets it, so a failed build fails the job
instead of silently testing only the os.scandir fallback).
"""

import os
import sys

from setuptools import Extension, setup

required = os.environ.get("MANYFILES_REQUIRE_C_EXTENSION") == "1"
ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(
        Extension(
            "manyfiles._dents",
            ["src/manyfiles/_dents.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=not required,
        )
    )

setup(ext_modules=ext_modules)
