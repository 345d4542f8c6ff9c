"""The settings of ``exo-p2p node``: the one table of them (``table``), what each one is
(``setting``), the checks some need (``checks``), their values applied into ``NodeConfig``
(``apply``) and docs/configuration.md rendered from the table (``docs``)."""
