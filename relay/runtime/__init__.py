"""relay/runtime."""
