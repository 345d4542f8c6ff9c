"""Every listener a node opens: admission per source address (``admission``), accept loops
that hold a bound (``accept``) and the table of listeners with their rules (``rules``)."""
