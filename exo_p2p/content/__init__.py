"""Rules over what a request carries, shared by the API, the master and the worker: structured
output formats and JSON schemas, JSON nesting depth, system turns, prefix digests."""
