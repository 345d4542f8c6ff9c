"""The commands that make a cluster: ``commands`` (``node``, ``cluster-secret``, ``invite``),
``node_flags`` (the ``node`` options generated from ``exo_p2p.settings``), ``node_config``
(flag values -> ``NodeConfig`` -> the node), ``membership``, ``invite`` and ``secret`` (join
tokens and cluster secrets kept in the data dir).
"""
