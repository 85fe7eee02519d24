"""relay/loop."""
