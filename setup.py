"""Build the optional native listing core ``manyfiles._dents``.

Like benhoyt/scandir and python-xxhash: one small extension, optional unless
MANYFILES_REQUIRE_C_EXTENSION is set (CI sets it, so a failed build fails the job
instead of silently testing only the os.scandir fallback).

When the build fails (no C compiler, no Python headers), the install still
succeeds: a warning is printed (pip shows it with -v) and a one-line note saying
why is installed next to where the module would be, for ``manyfiles info`` and
the listing commands to report (see src/manyfiles/_native.py).
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

required = os.environ.get("MANYFILES_REQUIRE_C_EXTENSION") == "1"
NOTE_FILE = "_dents_not_built.txt"  # read by manyfiles._native


class OptionalBuildExt(build_ext):
    """Build the C core if possible; otherwise warn loudly and record why."""

    def build_extension(self, ext):
        note = os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)), NOTE_FILE)
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, PlatformError) as exc:
            if required:
                raise
            reason = " ".join(str(exc).split()) or type(exc).__name__
            os.makedirs(os.path.dirname(note), exist_ok=True)
            with open(note, "w") as f:
                f.write(reason + "\n")
            print(
                f"WARNING: manyfiles: the C core ({ext.name}) was not built: {reason}\n"
                "WARNING: manyfiles works without it, listing with os.scandir (slower, and ~30x more\n"
                "WARNING: round trips on NFS); install a C compiler and Python headers (Debian:\n"
                "WARNING: apt-get install gcc python3-dev) and reinstall to get it.",
                file=sys.stderr,
            )
            return
        if os.path.exists(note):
            os.unlink(note)


ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(
        Extension(
            "manyfiles._dents",
            # one directory + module init, the one glob rule set, the parallel tree walker and its
            # remove-tree mode (listing/), the CRCs of s3pull's small-object checks and the one-call
            # install of small objects (s3/), the batch read of packed records (cache/).  One extension
            # at the package root: listing, remove (remove_tree), s3 and cache all use it.
            [
                "src/manyfiles/listing/_dents.c",
                "src/manyfiles/listing/_glob.c",
                "src/manyfiles/listing/_walk.c",
                "src/manyfiles/listing/_remove_tree.c",
                "src/manyfiles/s3/_crc.c",
                "src/manyfiles/s3/_install.c",
                "src/manyfiles/cache/_records.c",
            ],
            include_dirs=["src/manyfiles/listing"],  # _dents.h, for s3/_crc.c
            depends=["src/manyfiles/listing/_dents.h", "src/manyfiles/listing/_walk.h"],
            extra_compile_args=["-O2", "-std=gnu11", "-pthread", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            extra_link_args=["-pthread"],
            optional=not required,
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
