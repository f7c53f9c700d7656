"""A test double of 3FS's Python package (see ../README.md); only ``io`` exists."""
