"""Which master claims a node may follow: a claim must come with the cluster's log (pure rules).

A claim is a heartbeat whose ``master`` is its own ``node_id``; in an open cluster any host
that reaches the libp2p port can send one, with any term. The election (``election.decide``)
ranks only the claims this module admits, so a claimer cannot skip the election by
announcing a huge term: it must either

1. be the master this node already follows at that term (admitted when it was first
   followed; its log is then checked by the log sync), or
2. have a side: at least one other live node follows it (``election.support`` ≥ 2 — the
   winner of a healed partition, whose log may legitimately differ from a loser's), or
3. present the cluster's log: when the claimer is not ahead (``claim.last_idx <= own last
   index``), its ``Heartbeat.chain`` must equal this node's chain digest at
   ``claim.last_idx`` (``exo_p2p.state.chain``; pure, checked on every pass); when it is
   ahead, it must answer a log request from this node's last index, with this node's chain
   digest there, with events rather than a snapshot (or with a snapshot because that range
   is compacted away there, not because our tail diverged) — the probe, done by the cluster
   member over ``/exo-p2p/log/1``; or
4. have a log that diverged from this node's (its digest differs, or the probe was answered
   with a snapshot) while claiming no more than one term above what this node knows (the
   other side of a healed partition, where each side may be a single node, claimed the term
   after the one it followed). A claimer that does not answer the probe is refused, whatever
   its term: every node serves its log.

So a forged claim with a huge term is refused unless it presents a log that extends this
node's, and one with a plausible term must still answer for its log.

Rule 4 is one-sided on purpose: of two masters with diverged logs and terms two or more
apart, only the one with the higher term admits the other. So that such a split still
heals, the admitting master yields to a rival it outranks after ``RIVAL_YIELD_AFTER``
(``election`` rule 4); it never yields to a claim refused here, so a forged term opens
nothing: the node that refuses it keeps its seat. Probe answers are kept
per ``(node id, boot id, term)``; a refusal is re-checked after ``recheck_after`` seconds.

A claim that is neither admitted nor refused yet (a probe in flight) is *pending*: it is not
followed, but it keeps this node from starting an election of its own meanwhile.

This is not authentication: a host that copies the cluster's log can present it. Only a
closed cluster (``--cluster-secret``: peers without the key cannot connect) keeps outsiders
out; see docs/cluster.md "Security".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from exo_p2p import defaults
from exo_p2p.cluster.messages import Heartbeat, LogResponse


class ClaimStatus(Enum):
    ADMITTED = "admitted"
    REFUSED = "refused"
    PROBE = "probe"
    """Not known yet: the claimer is ahead of this node; ask it for the events after ours."""
    PENDING = "pending"
    """A probe of this claim is in flight."""


def log_prefix_check(claim: Heartbeat, own_last_idx: int, chain_at: Callable[[int], bytes | None]) -> bool | None:
    """Whether the claimer's log, as its heartbeat describes it, agrees with this node's
    (pure). True: the claimer's log up to ``claim.last_idx`` is this node's (same chain
    digest there; an empty log always agrees); False: it is not; None: this heartbeat
    cannot tell (the claimer is ahead of ``own_last_idx``, carries no digest, or the index is
    compacted away here), so a probe must."""
    if claim.last_idx == 0:
        return True
    if claim.last_idx > own_last_idx or not claim.chain:
        return None
    mine = chain_at(claim.last_idx)
    if mine is None:
        return None
    return mine == claim.chain


class ProbeAnswer(Enum):
    EXTENDS = "extends"
    """The claimer answered with events after this node's last index: its log extends ours."""
    COMPACTED = "compacted"
    """The claimer answered with a snapshot because our next events are compacted away in
    its log (nothing says our tail is not in it)."""
    DIVERGED = "diverged"
    """The claimer answered with a snapshot because our tail is not in its log."""
    NO_ANSWER = "no_answer"


def probe_answer(response: LogResponse | None) -> ProbeAnswer:
    """Classify a claimer's answer to this node's log request (from its last index + 1, with
    its chain digest there); None: no (decodable) answer."""
    if response is None:
        return ProbeAnswer.NO_ANSWER
    if response.snapshot is None:
        return ProbeAnswer.EXTENDS
    return ProbeAnswer.DIVERGED if response.diverged else ProbeAnswer.COMPACTED


@dataclass
class ClaimChecker:
    """Probe results per claim, by ``(node_id, boot_id, term)``, stamped with the caller's
    monotonic ``now`` (seconds)."""

    recheck_after: float = defaults.CLAIM_RECHECK_AFTER
    _probed: dict[tuple[str, str, int], tuple[ProbeAnswer, float]] = field(default_factory=dict)
    _in_flight: set[tuple[str, str, int]] = field(default_factory=set)

    @staticmethod
    def key(claim: Heartbeat) -> tuple[str, str, int]:
        return (claim.node_id, claim.boot_id, claim.term)

    def status(
        self,
        claim: Heartbeat,
        *,
        side: int,
        following: tuple[str | None, int],
        own_last_idx: int,
        own_term: int,
        chain_at: Callable[[int], bytes | None],
        now: float,
    ) -> ClaimStatus:
        """The rules of the module docstring for ``claim``, whose ``side`` is its support
        in this node's view; ``following`` is ``(master, term)`` this node follows and
        ``own_term`` the highest term it knows (its own, its log's)."""
        if following == (claim.node_id, claim.term) or side >= 2:
            return ClaimStatus.ADMITTED
        plausible = claim.term <= own_term + 1
        prefix = log_prefix_check(claim, own_last_idx, chain_at)
        if prefix is True:
            return ClaimStatus.ADMITTED
        key = self.key(claim)
        if key in self._in_flight:
            return ClaimStatus.PENDING
        probed = self._probed.get(key)
        if probed is not None:
            answer, at = probed
            if answer in (ProbeAnswer.EXTENDS, ProbeAnswer.COMPACTED) or (answer is ProbeAnswer.DIVERGED and plausible):
                return ClaimStatus.ADMITTED
            if now - at < self.recheck_after:
                return ClaimStatus.REFUSED
        if prefix is False and not plausible:
            return ClaimStatus.REFUSED
        return ClaimStatus.PROBE

    def probe_started(self, claim: Heartbeat) -> None:
        self._in_flight.add(self.key(claim))

    def probe_done(self, claim: Heartbeat, answer: ProbeAnswer, now: float) -> None:
        key = self.key(claim)
        self._in_flight.discard(key)
        self._probed[key] = (answer, now)
        if len(self._probed) > 1024:  # bounded: drop the oldest answers
            for old in sorted(self._probed, key=lambda k: self._probed[k][1])[:512]:
                del self._probed[old]
