"""Where models are: ``commands`` (``place``, ``delete``, ``stop``), ``replica_check`` (which
instances count as existing), ``waiting`` (the wait for ready, with progress) and ``transfer``
(``pull``, ``rm``).
"""
