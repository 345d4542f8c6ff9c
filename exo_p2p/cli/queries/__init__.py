"""Asking the cluster what it is doing: ``listing`` (``nodes``, ``models``, ``instances``,
``previews``), ``requests_log`` (``logs requests``), ``top`` and ``doctor`` (with
``doctor_checks``: the probes and the pure diagnosis).
"""
