"""What a node tells an operator about its work (docs/operations.md).

``registry.NodeMetrics``: the node's Prometheus registry, the counters and histograms of
finished requests, and the gauges read at each scrape (``collect.NodeCollector``: State,
this node's runners, the master's view when this node is master). ``request_log``: the
record of every finished request (a log line, a rotating JSONL file and the recent records
``GET /requests`` serves).
"""
