"""The outbox-relay command line: one module per command group; `main` parses and dispatches."""
