"""What people and scripts read: ``render`` (rich tables), ``fit`` (tables that fit the
terminal), ``readable`` (sizes, times, ids), ``json_shapes`` (``--json`` shapes) and
``placed_view`` (shrunk instances and their restore).
"""
