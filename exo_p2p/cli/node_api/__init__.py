"""Talking to a node's HTTP API: ``client`` (``NodeClient``, one method per endpoint),
``endpoint`` (which URL and key), ``http_transport`` (httpx over ``http.client``) and ``sse``
(a streamed chat answer decoded).
"""
