"""One contract, run on every Store: the in-memory fake and the real stores."""
