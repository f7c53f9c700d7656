"""The two command-line programs: ``kvstored`` (the daemon) and ``kvstore`` (the tool)."""
