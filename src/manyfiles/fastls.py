"""The fastls job as a library call: :mod:`manyfiles.listing.fastls`, at its public path."""

from manyfiles.listing.fastls import (
    FORMATS,
    ListReport,
    ListRequest,
    count_lines,
    decode_json_path,
    failure_lines,
    run,
)

__all__ = ["FORMATS", "ListReport", "ListRequest", "count_lines", "decode_json_path", "failure_lines", "run"]
