"""What the publisher does with a basic.nack: whose refusal it is, found out on a fresh channel.

A nack does not say why. A queue that really refuses (x-overflow reject-publish at its limit)
nacks every channel alike. A quorum queue electing a leader (its leader's node died) nacks
for as long as the election lasts, measured at 0.2-0.5 s; and RabbitMQ 3.10 goes on nacking a
channel it nacked once for half a minute or more, while a new channel is accepted.

So a nacked channel is retired (nothing more is sent on it: the exchange's next message opens
a new one). A nack on a channel that had confirms before it is the destination's (it took
messages and now refuses them: a full queue), reported at once as it always was (Fate.REJECTED:
an attempt, a circuit failure). A nack on a channel that has confirmed nothing yet (the first
answers after a failover to another node, or a channel opened during an election) may be the
cluster's: the message is sent again on a fresh channel after a pause long enough for an
election, and is confirmed then, costing no attempt and counting against no circuit. A message
nacked on `len(RESEND_PAUSES) + 1` channels in a row is the destination's refusal after all,
reported as today.
"""

from __future__ import annotations

# Pauses before each resend of a nacked message, seconds: an election (0.2-0.5 s measured on
# RabbitMQ 3.10, three nodes, under load) is over before the second. A queue that really
# rejects costs each of its messages this much (1 s) before the nack is reported.
RESEND_PAUSES = (0.25, 0.75)


def resend_pause(nacks: int, pauses: tuple[float, ...] = RESEND_PAUSES) -> float | None:
    """After a message's `nacks`-th nack (1 for the first): seconds until it is sent again on a
    fresh channel, or None when it is the destination's refusal, to be reported."""
    if nacks < 1 or nacks > len(pauses):
        return None
    return pauses[nacks - 1]
