"""Errors raised by exo_p2p.net (dial and request failures)."""


class NetError(Exception):
    """Base of the errors ``Network`` raises (dial and request failures)."""


class DialError(NetError):
    """A dial failed or did not finish within its timeout (e.g. a PSK mismatch)."""


class RequestError(NetError):
    """A request failed: timeout, stream error, bad frame, or the remote handler raised."""


class RemoteError(RequestError):
    """The remote handler raised; the message is the remote's description of the error."""
