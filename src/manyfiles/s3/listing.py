"""Moved to :mod:`manyfiles.s3.object_listing` (the name said "listing", which is fastls' package).

An alias, not a copy: ``manyfiles.s3.listing`` *is* that module.  It stays until cache/ imports
the new path.
"""

import sys

from manyfiles.s3 import object_listing

sys.modules[__name__] = object_listing
