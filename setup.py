"""Build the optional native listing core ``manyfiles._dents``.

Like benhoyt/scandir and python-xxhash: one small extension, optional unless
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
            # one directory + module init, the one glob rule set, the parallel tree walker
            ["src/manyfiles/_dents.c", "src/manyfiles/_glob.c", "src/manyfiles/_walk.c"],
            depends=["src/manyfiles/_dents.h"],
            extra_compile_args=["-O2", "-std=gnu11", "-pthread", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            extra_link_args=["-pthread"],
            optional=not required,
        )
    )

setup(ext_modules=ext_modules)
