"""The user interface: every line a person sees is formatted here, and every error is
mapped to its exit status here (``lines.Reporter.failure``)."""
