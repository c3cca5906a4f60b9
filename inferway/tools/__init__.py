"""User tools built on the rest: `verify`, cost reports, `optimize`."""
