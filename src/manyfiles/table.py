"""Listings as tables (``mf.scan``): :mod:`manyfiles.listing.table`, at its public path."""

from manyfiles.listing.table import ListingTable, Row, scan

__all__ = ["ListingTable", "Row", "scan"]
