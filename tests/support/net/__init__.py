"""Networks for the tests: a delaying relay, link labs in network namespaces and nodes in them,
network-layer peers (a hostile one too), careless and hostile TCP clients, and what a process
holds open.
"""
