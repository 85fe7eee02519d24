"""Applications consume what the relay published: a consumer, its handler outcomes, and the inbox
that makes at-least-once delivery effectively-once."""
