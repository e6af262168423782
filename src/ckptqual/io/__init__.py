"""I/O of one rank: the payload, the checkpoint engines (write and read) and the read engines of the sweep."""
