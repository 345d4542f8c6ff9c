"""The generation path every API family shares: a family's ``GenerationJob`` (``job``)
submitted as a task on the cluster and its chunks streamed back (``path``), the task across
moves (``serving_task``, ``resume``, ``replacement_progress``), what the client receives
(``client_stream``, ``turn``) and the record of each request (``request_trace``, ``rejected``).
"""
