"""Asking a placed model: ``commands`` (``chat``, ``run``), ``session`` (one streamed answer, the
interactive loop), ``structured`` (``--json``/``--schema``), ``local_node`` and ``private_state``
(the node ``run`` starts when none answers) and ``embed`` (``embed``).
"""
