"""Links between nodes: what each address of a peer measures (RTT, bandwidth), the per-token
network cost placement ranks rings by, and the probes that measure (docs/links.md)."""
