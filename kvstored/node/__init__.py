"""A storage node: a DRAM segment, an SSD backend, and the data server in front."""
