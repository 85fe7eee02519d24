"""relay/demo."""
