"""A node's logs: their format, level and file (``configure``) and bounded log files (``rotation``)."""
